"""The non-streaming answer: reads an upstream SSE stream into one `chat.completion` or
`text_completion` body. The joining is `wire.join`'s, the client's too; this adds the reading
(deadlines, the tally, a preemptible request's progress, the bounds on what a backend may make it
hold: `limits.max_answer_bytes` of stream in all, `limits.max_event_bytes` an event) and the usage
the gateway counted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from tailguard.clock import monotonic
from tailguard.config import LimitsConfig
from tailguard.gateway.upstream.client import RelayError, Suspended, stream_failure
from tailguard.gateway.upstream.h1 import H1Response, UpstreamBroke
from tailguard.gateway.upstream.resume import Transcript
from tailguard.gateway.upstream.tally import Tally
from tailguard.types import FailureKind
from tailguard.wire.chunks import delta_text, has_content, running_usage
from tailguard.wire.join import ChunkJoiner
from tailguard.wire.openai import Endpoint
from tailguard.wire.sse import DONE, EventTooLarge, SSEDecoder

if TYPE_CHECKING:
    from tailguard.guards.output import OutputScreen


@dataclass(slots=True)
class Assembler:
    """Turns an upstream SSE stream into one `chat.completion` / `text_completion` body."""

    endpoint: Endpoint
    tally: Tally
    limits: LimitsConfig
    progress: Transcript | None = None  # set for preemptible requests
    service_tier: str | None = None  # the tier to report, when the request named one
    screen: OutputScreen | None = None  # its output guards: they read the whole answer before it goes
    joiner: ChunkJoiner = field(init=False)
    read_bytes: int = 0  # of stream, over every run of a resumed request

    def __post_init__(self) -> None:
        self.joiner = ChunkJoiner(chat=self.endpoint == "chat")

    async def run(self, up: H1Response) -> bytes:
        """Assemble until the upstream ends. A preemptible request's assembler outlives a
        suspension (`Suspended`) and keeps accumulating over the resumed run."""
        dec = SSEDecoder(self.limits.max_event_bytes)
        prog = self.progress
        self.tally.start_run()
        done = False
        try:
            while data := await up.readany():
                if prog is not None and prog.suspended:
                    raise Suspended()
                self._count(len(data))
                now = monotonic()
                self.tally.watchdog.last_at = now
                for ev in dec.feed(data):
                    done = done or ev.data == DONE
                    self._absorb(ev.data, now)
                self.tally.no_content(now, self.limits)  # (nothing once this run's content has come)
            for ev in dec.flush():
                done = done or ev.data == DONE
                self._absorb(ev.data, monotonic())
        except (UpstreamBroke, EventTooLarge) as e:
            if isinstance(e, UpstreamBroke) and prog is not None and prog.suspended:
                raise Suspended() from None
            raise stream_failure(e) from None
        if prog is not None and prog.suspended and not done:
            raise Suspended()
        error = self.joiner.error
        if error is not None:
            raise RelayError(FailureKind.STREAM_ERROR, str(error.get("message", "upstream error")))
        if prog is not None:
            usage = self.tally.usage
            usage.prompt_tokens, usage.completion_tokens = prog.client_usage(usage.prompt_tokens, usage.completion_tokens)
        if self.screen is not None:
            return orjson.dumps(await self.screen.whole(self.answer()))
        return self.body()

    def _count(self, n: int) -> None:
        """The answer is held until it ends: bounded, or a backend that never ends it would grow
        the gateway until `total_s`."""
        self.read_bytes += n
        if self.read_bytes > self.limits.max_answer_bytes:
            raise RelayError(FailureKind.PROTOCOL, f"Backend sent over {self.limits.max_answer_bytes} bytes for one "
                             "non-stream answer (limits.max_answer_bytes)")

    def _absorb(self, data: bytes, now: float) -> None:
        if data == DONE:
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RelayError(FailureKind.PROTOCOL, "Backend sent a chunk that is not JSON.") from None
        if not isinstance(obj, dict):
            return
        if self.tally.traced:
            self.tally.answer_end(data, 0, len(data))
        if self.progress is not None:  # its token ids kept; a continuation by ids back in chat's shape
            obj = self.progress.absorb(obj)
        self.joiner.feed(obj)
        if self.joiner.error is not None:  # the request fails with it at the end: nothing more to count
            return
        self.tally.usage.read(obj)
        if has_content(data):
            self.tally.content(now)
            if self.progress is not None:
                pt, ct = running_usage(obj)
                self.progress.add(delta_text(obj, self.endpoint == "chat"), ct, pt)

    def text(self) -> str:
        return self.joiner.text()

    def body(self) -> bytes:
        return orjson.dumps(self.answer())

    def answer(self) -> dict[str, Any]:
        """The joined answer with the usage the gateway counted: over every run of a resumed
        request, and estimated where the engine sent none."""
        out = self.joiner.finish()
        usage, t = self.tally.usage, self.tally.times
        pt = usage.prompt_tokens if usage.prompt_tokens is not None else t.prompt_tokens
        ct = usage.completion_tokens if usage.completion_tokens is not None else t.content_chunks
        out["usage"] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
        if self.service_tier is not None:
            out["service_tier"] = self.service_tier
        return out
