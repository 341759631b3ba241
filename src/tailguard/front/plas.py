"""The program stage of the queue's order: program-level least attained service (PLAS); pure.

Inside a rank (and, with fair sharing, inside a caller), a call whose program has received less
service so far goes first, the shortest job breaking ties, so the first call of a new program is
not stuck behind a long agent's twentieth, whose context makes each of its calls long. This is
Autellix's PLAS (Luo et al., "Autellix: An Efficient Serving Engine for LLM Agents as General
Programs", 2025): a call's priority is its program's attained service when it arrives,
discretised into levels (its multi-level queues), so calls of programs that have received about
as much compete by size. A program's service is the tokens its calls used (prompt and generated,
`front.programs`), so a call with no program (or a program's first) is level 0 and the order of
requests that name no program is the shortest-job-first order of before.

Starvation is bounded by the queue's aging (`QueueParams.aging_s`): a call that has waited that
long is overtaken by no younger call of its rank, whatever its level.

    level(service_tokens=30_000, quantum_tokens=4096, levels=8)       # 3
    key = order_key(level, est_tokens)                                  # what the queue's heap sorts on
    overtakes(smallest_key, oldest_key, sjf_size_ratio)                 # does the smallest go before the oldest
"""

from __future__ import annotations

import math

OrderKey = tuple[int, float]  # (program level, job size in tokens)


def level(service_tokens: float, quantum_tokens: int, levels: int) -> int:
    """The level of a program that has received `service_tokens`: 0 below one quantum, then one
    more each time the service doubles, at most `levels - 1`."""
    if service_tokens < quantum_tokens or levels < 2:
        return 0
    return min(levels - 1, int(math.log2(service_tokens / quantum_tokens)) + 1)


def order_key(program_level: int, est_tokens: int) -> OrderKey:
    """The key a rank's waiting calls are sorted by: their program's level, then their size."""
    return program_level, float(est_tokens)


def overtakes(smallest: OrderKey, oldest: OrderKey, size_ratio: float) -> bool:
    """Whether the call first by `order_key` goes before the oldest waiting call (neither aged):
    when its program has received less (a lower level), or, at one level, when it is more than
    `size_ratio` times smaller (shortest job first across a real size gap, as before)."""
    if smallest[0] != oldest[0]:
        return smallest[0] < oldest[0]
    return smallest[1] * size_ratio < oldest[1]
