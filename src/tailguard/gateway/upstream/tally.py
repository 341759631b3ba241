"""One request's chunk bookkeeping, kept the same way by every path that reads an upstream
stream (the client relay, the tracked relay of a preemptible request, the non-stream assembler):
first content, inter-chunk gaps, the content chunk count and the usage chunk."""

from __future__ import annotations

from dataclasses import dataclass, field

from tailguard.gateway.ops.metrics import ChunkHistogram
from tailguard.gateway.request import Request
from tailguard.gateway.upstream.watchdog import Watchdog
from tailguard.wire.chunks import Usage


@dataclass(slots=True)
class Tally:
    """Counts content chunks into `times` and `itl`, and ends the watchdog's first-token phase.

    It outlives a suspension: a resumed run's first chunk is not a first token for the request
    (its gap since the last chunk before the suspension is an ITL sample), but it is for the
    watchdog, whose first-token deadline applies again to each run (`start_run`)."""

    times: Request  # the request's record: the chunk facts are written here only
    watchdog: Watchdog
    itl: ChunkHistogram
    usage: Usage = field(default_factory=Usage)
    run_started: bool = False

    def start_run(self) -> None:
        self.run_started = False

    def content(self, now: float, n: int = 1) -> None:
        """`n` content chunks arrived in one read at `now`: the first has the gap since the last
        content chunk, the others none."""
        t = self.times
        t.content_chunks += n
        if not self.run_started:
            self.run_started = True
            self.watchdog.first_content(now)
        if t.first_content_at is None:
            t.first_content_at = now
        else:
            self.itl.observe(now - t.last_content_at)  # type: ignore[operator]
        if n > 1:
            self.itl.observe_zeros(n - 1)
        t.last_content_at = now
