"""The program part of the queue's order: program-level least attained service (PLAS), then
the oldest program first; pure. `front.order`'s pick sorts on these keys: before a call's deadline
(`program_rank`) and before its size (`order_key`).

Inside a rank (and, with fair sharing, inside a caller), a call goes by its program's level: the
service the program has received so far (the tokens its calls used, `front.programs`),
discretised as Autellix discretises it into its multi-level queues (Luo et al., "Autellix: An
Efficient Serving Engine for LLM Agents as General Programs", 2025): level 0 below one quantum,
one level more each time it doubles. A lower level goes first, so the first calls of a new
program are not stuck behind a long agent's twentieth, whose context makes each of its calls long.

Within a level above 0, the call of the program that started first goes first (a program under
way is finished before a younger one is helped along: the continuing call is favoured). With the
default of 2 levels that is: new programs first, then the programs under way by age. Splitting the
programs under way by what they received instead (least attained service across 8 levels) serves
the long programs in turn, a step each, so they all end late: on the agent workload of
`benchmarks/agents.py` it made long programs' P99 E2E 1.58x what ranking them by age gives, and
the engines' prefix hit ratio fell from 0.64 to 0.47 (docs/agents.md). Within level 0, where
every call that names no program is, the shortest job goes first as before (across a real size
gap); so a gateway that sees no programs orders exactly as it did.

Starvation is bounded by the queue's aging (`QueueParams.aging_s`): a call that has waited that
long is overtaken by no younger call of its rank, whatever its level.

    level(service_tokens=30_000, quantum_tokens=12288, levels=2)      # 1
    key = order_key(pending)                                             # what the queue's size heap sorts on
    overtakes(first_key, oldest_key, sjf_size_ratio)                     # does the first go before the oldest
"""

from __future__ import annotations

import math
from typing import Protocol

OrderKey = tuple[int, float, float]  # (program level, its program's start in a level above 0, job size)


def level(service_tokens: float, quantum_tokens: int, levels: int) -> int:
    """The level of a program that has received `service_tokens`: 0 below one quantum, then one
    more each time the service doubles, at most `levels - 1`."""
    if service_tokens < quantum_tokens or levels < 2:
        return 0
    return min(levels - 1, int(math.log2(service_tokens / quantum_tokens)) + 1)


class Ordered(Protocol):
    """What the order reads of a waiting call (`front.queue.Pending`)."""

    @property
    def level(self) -> int: ...
    @property
    def program_at(self) -> float: ...
    @property
    def cost(self) -> int: ...


def program_rank(req: Ordered) -> tuple[int, float]:
    """A call's place by its program alone: its program's level, then (above level 0) the instant
    its program started. What the queue's deadline order (`front.order`) puts before deadlines."""
    lvl = req.level
    return lvl, req.program_at if lvl else 0.0


def order_key(req: Ordered) -> OrderKey:
    """The key a rank's waiting calls are sorted by: their program's level, then (above level 0)
    the instant their program started, then their size (its uncached work: `Pending.cost`)."""
    lvl, at = program_rank(req)
    return lvl, at, float(req.cost)


def overtakes(first: OrderKey, oldest: OrderKey, size_ratio: float) -> bool:
    """Whether the call first by `order_key` goes before the oldest waiting call (neither aged):
    when its program has received less (a lower level); at one level above 0, when its program
    started earlier; else (level 0, or one program) when it is more than `size_ratio` times
    smaller (shortest job first across a real size gap, as before)."""
    if first[0] != oldest[0]:
        return first[0] < oldest[0]
    if first[1] != oldest[1]:
        return first[1] < oldest[1]
    return first[2] * size_ratio < oldest[2]
