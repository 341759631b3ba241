"""What the bench keeps per request, the cheap scan that finds content chunks in an SSE stream, and
`requests.jsonl`: one JSON object per request, enough to rebuild every statistic and plot.

Times in a record are seconds since the run's start (`t0`); `chunk_at` holds the arrival time of
every chunk that carried generated content. A failed request keeps what it saw before failing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Literal

import orjson

ErrorKind = Literal["http", "connect", "disconnect", "protocol", "stream_error", "truncated", "timeout"]
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
    attribution: dict[str, float] | None = None  # where the E2E went (bench.attribution.PARTS)

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


# --- scanning stream chunks without parsing JSON ------------------------------------------------

_CONTENT_KEYS = (b'"content":', b'"text":')
_USAGE_KEY = b'"usage":'


def has_content(data: bytes) -> bool:
    """True if a chat or completions chunk carries a non-empty generated string. Role-only chunks
    (`"content":""`), `null` content and usage-only chunks are not content. Looks at bytes only:
    this runs once per token, so it must not parse JSON."""
    for key in _CONTENT_KEYS:
        i = data.find(key)
        while i >= 0:
            j = i + len(key)
            while j < len(data) and data[j] == 0x20:
                j += 1
            if data[j:j + 1] == b'"' and data[j + 1:j + 2] != b'"':
                return True
            i = data.find(key, j)
    return False


def usage_of(data: bytes) -> dict[str, Any] | None:
    """The `usage` object of a chunk, parsed only when the chunk has a non-null one (once per stream)."""
    i = data.find(_USAGE_KEY)
    if i < 0:
        return None
    j = i + len(_USAGE_KEY)
    while j < len(data) and data[j] == 0x20:
        j += 1
    if data[j:j + 1] != b"{":
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None


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


def is_error_event(data: bytes) -> bool:
    return data.startswith(b'{"error"') or data.startswith(b'{ "error"')
