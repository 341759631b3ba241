"""What the bench keeps per request, the reader that records a streamed answer into it, and
`requests.jsonl`: one JSON object per request, enough to rebuild every statistic and plot.

Times in a record are seconds since the run's start (`t0`); `chunk_at` holds the arrival time of
every chunk that carried generated content. A failed request keeps what it saw before failing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Literal

import orjson

from tailguard.wire.chunks import Usage, delta_text, has_content, is_error, parse, usage_of
from tailguard.wire.framing import FRAMINGS, Framing
from tailguard.wire.sse import DONE, SSEDecoder

ErrorKind = Literal["http", "connect", "disconnect", "protocol", "stream_error", "truncated", "timeout", "interrupted"]
TimeoutPhase = Literal["connect", "first_token", "total"]


@dataclass(slots=True)
class RequestRecord:
    index: int
    cls: str
    warmup: bool
    scheduled_at: float
    sent_at: float = 0.0
    ended_at: float = 0.0
    status: int | None = None
    ok: bool = False
    error_kind: str | None = None
    error: str | None = None
    timeout_phase: str | None = None
    first_token_at: float | None = None
    chunk_at: list[float] = field(default_factory=list)
    output_tokens: int = 0
    usage_output_tokens: int | None = None
    prompt_tokens: int = 0
    usage_prompt_tokens: int | None = None
    max_tokens: int = 0
    stream: bool = True
    queue_ms: float | None = None
    backend: str | None = None
    server_class: str | None = None
    server_timing_s: dict[str, float] | None = None  # the gateway's Server-Timing, in seconds
    config: str | None = None  # the gateway's X-Tailguard-Config: the hash of the config it ran under
    attribution: dict[str, float] | None = None  # where the E2E went (bench.attribution.PARTS)
    session: str | None = None  # the session it was sent in (a trace's), so a replay of this run keeps it
    # A call of an agent program (`bench.programs`): the program's index, this call's number in it
    # (from 1), and whether its answer was to end the program.
    program: int | None = None
    program_call: int | None = None
    program_last: bool = False

    # Derived values, measured from the schedule (design principle 5).
    @property
    def e2e_s(self) -> float:
        return self.ended_at - self.scheduled_at

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.scheduled_at

    @property
    def dispatch_lag_s(self) -> float:
        return self.sent_at - self.scheduled_at

    @property
    def timed_out(self) -> bool:
        return self.error_kind == "timeout"

    def finish_tokens(self) -> None:
        """Output tokens: the server's usage when it sent one, else the content chunks counted."""
        self.output_tokens = self.usage_output_tokens if self.usage_output_tokens is not None else len(self.chunk_at)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["chunk_at"] = [round(t, 6) for t in self.chunk_at]
        for k in ("scheduled_at", "sent_at", "ended_at", "first_token_at"):
            if d[k] is not None:
                d[k] = round(d[k], 6)
        return orjson.dumps(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def write_jsonl(records: Iterable[RequestRecord], path: Path) -> None:
    with path.open("wb") as f:
        for r in records:
            f.write(r.to_json())
            f.write(b"\n")


def read_jsonl(path: Path) -> list[RequestRecord]:
    out: list[RequestRecord] = []
    with path.open("rb") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(RequestRecord.from_dict(orjson.loads(line)))
                except (orjson.JSONDecodeError, TypeError) as e:
                    raise ValueError(f"{path}:{i}: not a request record: {e}") from None
    return out


# --- reading a streamed answer ------------------------------------------------------------------

ERROR_TEXT_LIMIT = 300  # bytes of a server's error text kept in a record


class StreamRecorder:
    """Reads one streamed answer into its record as it arrives: when each chunk that carries
    content came (what counts is `wire.chunks`' definition, the gateway's too, so both measure
    the same TTFT), the usage, an error event, and whether `data: [DONE]` ended it. Pure: told
    the time; framed by the one SSE decoder, so every line-end style reads alike.

        reader = StreamRecorder(rec)
        for data in reads:
            if reader.feed(data, now):   # this read brought the first token
                ...
        reader.finish(now)
    """

    __slots__ = ("rec", "_decoder", "_done", "_framing", "_answer")

    def __init__(self, rec: RequestRecord, endpoint: str = "chat", answer: list[str] | None = None) -> None:
        self.rec = rec
        self._answer = answer  # the answer's text is added here, piece by piece, when given (agent programs)
        self._decoder = SSEDecoder()
        self._done = False
        # The Responses and Messages routes' typed events, read by their own tests (`wire.framing`).
        self._framing = FRAMINGS.get(endpoint) if endpoint not in ("chat", "completions") else None  # type: ignore[call-overload]

    def feed(self, data: bytes, now: float) -> bool:
        """Record one read at `now`; True if it brought the first content chunk."""
        waiting = self.rec.first_token_at is None
        for ev in self._decoder.feed(data):
            self._event(ev.data, now)
        return waiting and self.rec.first_token_at is not None

    def finish(self, now: float) -> None:
        """At EOF: a last event cut off before its blank line still counts; no `[DONE]` means
        the answer was truncated."""
        for ev in self._decoder.flush():
            self._event(ev.data, now)
        rec = self.rec
        if not self._done and rec.error_kind is None:
            rec.error_kind = "truncated"
            rec.error = "stream ended without its last event" if self._framing else "stream ended without data: [DONE]"

    def _event(self, data: bytes, now: float) -> None:
        rec = self.rec
        if self._framing is not None:
            self._typed_event(self._framing, data, now)
        elif data == DONE:
            self._done = True
        elif has_content(data):
            rec.chunk_at.append(now)
            if rec.first_token_at is None:
                rec.first_token_at = now
            self._usage(data)  # some servers put a running usage on every chunk
            if self._answer is not None:
                self._answer.append(delta_text(parse(data), True))
        elif is_error(data):
            rec.error_kind = "stream_error"
            rec.error = data[:ERROR_TEXT_LIMIT].decode("utf-8", "replace")
        else:
            self._usage(data)

    def _typed_event(self, f: Framing, data: bytes, now: float) -> None:
        """An event of a typed stream: content by the route's own test (a Responses `*.delta`, an
        Anthropic `content_block_delta`), its usage events, its error and its last event."""
        rec, end = self.rec, len(data)
        if f.has_content(data, 0, end):
            rec.chunk_at.append(now)
            if rec.first_token_at is None:
                rec.first_token_at = now
            return
        if f.is_error(data, 0, end):
            rec.error_kind = "stream_error"
            rec.error = data[:ERROR_TEXT_LIMIT].decode("utf-8", "replace")
        if f.has_usage(data, 0, end):
            usage = Usage(rec.usage_prompt_tokens, rec.usage_output_tokens)
            f.read_usage(usage, parse(data))
            rec.usage_prompt_tokens, rec.usage_output_tokens = usage.prompt_tokens, usage.completion_tokens
        if f.is_last(data, 0, end):
            self._done = True

    def _usage(self, data: bytes) -> None:
        usage = usage_of(data)
        if usage is not None:
            ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
            if isinstance(ct, int):
                self.rec.usage_output_tokens = ct
            if isinstance(pt, int):
                self.rec.usage_prompt_tokens = pt


def parse_server_timing(value: str) -> dict[str, float]:
    """`queue;dur=12.5, ttft;dur=80` -> {"queue": 0.0125, "ttft": 0.08}: durations in seconds,
    entries without a readable `dur` skipped (the header is the server's, not ours to trust)."""
    out: dict[str, float] = {}
    for entry in value.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        for p in params:
            key, _, v = p.partition("=")
            if key.strip().lower() == "dur" and name:
                try:
                    out[name] = float(v.strip().strip('"')) / 1000.0
                except ValueError:
                    pass
    return out
