"""The non-streaming answer: reads an upstream SSE stream into one `chat.completion` or
`text_completion` body. The joining is `wire.join`'s, the client's too; this adds the reading
(deadlines, the tally, a preemptible request's transcript, the bounds on what a backend may make it
hold: the answer's bytes in all (`gateway.upstream.bound`: what its `max_tokens` allows, at most
`limits.max_answer_bytes`), `limits.max_event_bytes` an event), the check that it is an SSE stream
of chunks at all, and the usage the gateway counted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from tailguard.config import LimitsConfig
from tailguard.gateway.upstream.client import RelayError, Suspended, check_answer, stream_failure
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
    transcript: Transcript | None = None  # set for preemptible requests
    service_tier: str | None = None  # the tier to report, when the request named one
    screen: OutputScreen | None = None  # its output guards: they read the whole answer before it goes
    joiner: ChunkJoiner = field(init=False)
    chunks: int = 0  # JSON chunks read, over every run of a resumed request

    def __post_init__(self) -> None:
        self.joiner = ChunkJoiner(chat=self.endpoint == "chat")

    async def run(self, up: H1Response) -> bytes:
        """Assemble until the upstream ends. A preemptible request's assembler outlives a
        suspension (`Suspended`) and keeps accumulating over the resumed run."""
        check_answer(up, self.tally.request.backend, stream=True)
        self.tally.start_run(stream=False)
        try:
            done = await self._read(up)
        finally:
            self.tally.end_run()
        transcript = self.transcript
        if transcript is not None and transcript.suspended and not done:
            raise Suspended()
        error = self.joiner.error
        if error is not None:
            raise RelayError(FailureKind.STREAM_ERROR, str(error.get("message", "upstream error")))
        if not self.chunks:
            raise RelayError(FailureKind.PROTOCOL, f"Backend '{self.tally.request.backend}' ended its stream without "
                             "a chunk")
        if transcript is not None:
            usage = self.tally.usage
            usage.prompt_tokens, usage.completion_tokens = transcript.client_usage(usage.prompt_tokens,
                                                                                   usage.completion_tokens)
        if self.screen is not None:
            return orjson.dumps(await self.screen.whole(self.answer()))
        return self.body()

    async def _read(self, up: H1Response) -> bool:
        """Absorb the stream's events until it ends; whether it said `[DONE]`."""
        dec = SSEDecoder(self.limits.max_event_bytes)
        transcript = self.transcript
        done = False
        try:
            while data := await up.readany():
                if transcript is not None and transcript.suspended:
                    raise Suspended()
                now = self.tally.clock()
                self.tally.watchdog.last_at = now
                self.tally.read(len(data))
                for ev in dec.feed(data):
                    done = done or ev.data == DONE
                    self._absorb(ev.data, now)
                self.tally.no_content(now, self.limits)  # (nothing once this run's content has come)
            for ev in dec.flush():
                done = done or ev.data == DONE
                self._absorb(ev.data, self.tally.clock())
        except (UpstreamBroke, EventTooLarge) as e:
            if isinstance(e, UpstreamBroke) and transcript is not None and transcript.suspended:
                raise Suspended() from None
            raise stream_failure(e) from None
        return done

    def _absorb(self, data: bytes, now: float) -> None:
        if data == DONE:
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RelayError(FailureKind.PROTOCOL, "Backend sent a chunk that is not JSON.") from None
        if not isinstance(obj, dict):
            return
        self.chunks += 1
        if self.tally.traced:
            self.tally.answer_end(data, 0, len(data))
        if self.transcript is not None:  # its token ids kept; a continuation by ids back in chat's shape
            obj = self.transcript.absorb(obj)
        self.joiner.feed(obj)
        if self.joiner.error is not None:  # the request fails with it at the end: nothing more to count
            return
        self.tally.usage.read(obj)
        self.tally.counted()
        if has_content(data):
            self.tally.content(now)
            if self.transcript is not None:
                pt, ct = running_usage(obj)
                self.transcript.add(delta_text(obj, self.endpoint == "chat"), ct, pt)

    def text(self) -> str:
        return self.joiner.text()

    def body(self) -> bytes:
        return orjson.dumps(self.answer())

    def answer(self) -> dict[str, Any]:
        """The joined answer with the usage the gateway counted: over every run of a resumed
        request, and estimated where the engine sent none."""
        out = self.joiner.finish()
        usage, t = self.tally.usage, self.tally.request
        pt = usage.prompt_tokens if usage.prompt_tokens is not None else t.prompt_tokens
        ct = usage.completion_tokens if usage.completion_tokens is not None else t.content_chunks
        out["usage"] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
        if self.service_tier is not None:
            out["service_tier"] = self.service_tier
        return out
