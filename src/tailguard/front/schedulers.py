"""Which scheduler the parameters name, and a new one that takes over an old one's state at a
live reconfiguration; pure. Apart from the policies (`front.queue`, `front.ranked`) because it
also builds `front.fairqueue`'s scheduler, which is built on them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tailguard.errors import ConfigError
from tailguard.front.fairqueue import FairShareScheduler
from tailguard.front.params import ClassSpec, QueueParams
from tailguard.front.queue import BaseScheduler, FcfsScheduler
from tailguard.front.ranked import RankedSjfScheduler

SCHEDULERS: dict[str, type[BaseScheduler]] = {
    "fcfs": FcfsScheduler,
    "ranked-sjf": RankedSjfScheduler,
}


def carry_over(old: BaseScheduler, cfg: QueueParams, classes: Iterable[ClassSpec],
               weights: Mapping[str, float] | None = None) -> BaseScheduler:
    """A scheduler for new parameters that keeps everything `old` knows: its queued requests
    (pushed again in arrival order without admission checks, each with its class's new rank and
    its own wait bound), the running set its `min_share` guarantees count, and its admission
    measurements. What a live reconfiguration needs: nobody admitted is refused or lost."""
    new = make_scheduler(cfg, classes, weights)
    new.take_over(old)
    return new


def make_scheduler(cfg: QueueParams, classes: Iterable[ClassSpec],
                   weights: Mapping[str, float] | None = None) -> BaseScheduler:
    """The policy named by `cfg.policy` (`ranked-sjf` with `cfg.fair_share`: `FairShareScheduler`,
    callers weighed by `weights`); an unknown name lists the known ones. `ranked-sjf`'s order
    inside a rank (`front.order`): caller fair share as a grouping stage (with `fair_share`), then
    program attained service, deadline and size in the pick's keys (`front.plas`)."""
    factory = SCHEDULERS.get(cfg.policy)
    if factory is None:
        raise ConfigError(f"unknown scheduler policy {cfg.policy!r} (known: {', '.join(SCHEDULERS)})")
    if cfg.fair_share:
        if factory is not RankedSjfScheduler:
            raise ConfigError(f"fair_share works with the ranked-sjf policy, not {cfg.policy!r}")
        return FairShareScheduler(cfg, classes, weights)
    return factory(cfg, classes)
