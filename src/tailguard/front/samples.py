"""What one ended request shows of its backend's latency between content chunks, for that
backend's adaptive cap (`front.adaptive`), worked out one way for every driver; pure.

The gateway's dispatcher and the DES both call `sample` as a request on an adaptive backend ends
and hand what it gives to the front as `Observed`: the mean gap between its content chunks (none
across a suspension, whose continuation is a run of its own). Its TTFT the front takes itself,
from its own `Start` to the driver's `FirstContent` (which a driver tells for a request on an
adaptive backend: `Front.wants_first_content`), so the cap hears it when the first token comes,
not only when the answer ends.
"""

from __future__ import annotations

from tailguard.front.counts import Counts
from tailguard.front.events import Observed


def sample(backend: str, first_at: float | None, last_at: float | None, chunks: int, counts: Counts) -> Observed | None:
    """The `Observed` an ended request gives (None: nothing to learn from it). `first_at`,
    `last_at`: its first and last content; `chunks`: its content chunks."""
    if first_at is None or last_at is None or chunks < 2 or counts.preemptions:
        return None
    return Observed(backend, itl_s=(last_at - first_at) / (chunks - 1))
