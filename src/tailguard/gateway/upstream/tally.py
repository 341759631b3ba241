"""One request's chunk bookkeeping, kept the same way by every path that reads an upstream
stream (the client relay, the tracked relay of a preemptible request, the non-stream assembler):
first content, inter-chunk gaps, the content chunk count and the usage chunk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tailguard.clock import Now
from tailguard.config.limits import LimitsConfig
from tailguard.gateway.ops.metrics import ChunkHistogram
from tailguard.gateway.request import Request
from tailguard.gateway.upstream.client import RelayError
from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tailguard.types import FailureKind
from tailguard.wire.chunks import Usage, finish_reasons, response_id

MAX_CHOICES = 128  # finish reasons kept per request (OpenAI's `n` is at most 128)


@dataclass(slots=True)
class Tally:
    """Counts content chunks into `times` and `itl`, and ends the watchdog's first-token phase.

    It outlives a suspension: a resumed run's first chunk is not a first token for the request
    (its gap since the last chunk before the suspension is an ITL sample), but it is for the
    watchdog, whose first-token deadline applies again to each run (`start_run`)."""

    times: Request  # the request's record: the chunk facts are written here only
    watchdog: DeadlineWatch
    itl: ChunkHistogram
    clock: Now  # the gateway's one clock: every path that reads the stream reads it here
    # A traced request's chunks are scanned for how its answer ended (`answer_end`); an untraced
    # one's never are, so telemetry off costs the relay one attribute read per chunk.
    traced: bool = False
    usage: Usage = field(default_factory=Usage)
    run_started: bool = False
    # Reads of this run that brought bytes but no content yet, and when the second came: a role
    # chunk and then silence is a long prefill; bytes that keep coming without content are not.
    empty_reads: int = 0
    empty_since: float = 0.0
    # Told the instant of the request's first content, when its front wants to know it (a TTFT
    # sample of an adaptive backend: `Front.wants_first_content`); once per request, off the
    # per-chunk path.
    on_first: Callable[[float], None] | None = None

    def start_run(self) -> None:
        self.run_started = False
        self.empty_reads = 0

    def no_content(self, now: float, limits: LimitsConfig) -> None:
        """A read before this run's first content brought none: past `limits.max_preamble_s` from
        the second such read, the attempt fails (shorter than the first-token deadline, which a
        long prefill needs)."""
        if self.run_started:
            return
        self.empty_reads += 1
        if self.empty_reads == 2:
            self.empty_since = now
        elif self.empty_reads > 2 and now - self.empty_since > limits.max_preamble_s:
            raise RelayError(FailureKind.PROTOCOL, f"Backend kept sending bytes without content for "
                             f"{now - self.empty_since:.1f} s, over limits.max_preamble_s ({limits.max_preamble_s:g})")

    def content(self, now: float, n: int = 1) -> None:
        """`n` content chunks arrived in one read at `now`: the first has the gap since the last
        content chunk, the others none. The usual chunk (one, past the run's first) costs one
        test before its gap is counted: the relay calls this per chunk."""
        t = self.times
        t.content_chunks += n
        last, t.last_content_at = t.last_content_at, now
        if not self.run_started:
            self.run_started = True
            self.watchdog.first_content(now)
        if last is None:
            t.first_content_at = now
            if self.on_first is not None:
                self.on_first(now)
        else:
            self.itl.observe(now - last)
        if n > 1:
            self.itl.observe_zeros(n - 1)

    def answer_end(self, data: bytes, start: int, end: int) -> None:
        """A traced request's event(s) in data[start:end]: the response id (from the first event
        that has one) and each choice's finish reason, onto the record."""
        t = self.times
        if t.response_id is None:
            t.response_id = response_id(data, start, end)
        if len(t.finish_reasons) < MAX_CHOICES:
            reasons = finish_reasons(data, start, end)
            if reasons:
                t.finish_reasons = (t.finish_reasons + tuple(reasons))[:MAX_CHOICES]
