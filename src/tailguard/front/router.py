"""Where a request goes: among the backends that may take it, the one its routing policy picks;
pure, no I/O.

A backend may take a request when it serves the request's model, belongs to one of its class's
pools (tried in order: the first pool with a backend that has room wins), is healthy, not retiring,
not ejected (unless so many are that the pool is in panic: `front.ejection`), not excluded (a
retry's earlier backends) and has a slot its class may take (`front.slots`). Among those:

- `least-tokens`: the least load, where load is the estimated tokens in flight there (prompt +
  output of each request it runs), plus what the engine itself reports running and waiting beyond
  the gateway's own requests (other clients' work; a reading older than `engine_load_ttl_s` counts
  as none), over its capacity (`max_concurrency` x `weight`). SGLang's model gateway's `least_load`
  scores alike, (queued + in-flight tokens) / throughput. Ties go to the backend bound least
  recently, which spreads an idle fleet round-robin.
- `prefix-affinity` (the default): the backend that served the longest part of this prompt
  (`front.prefix`), while it holds at least `min_prefix_share` of it and its load is within
  `balance_factor` x the least loaded's plus `balance_slack` requests' worth; else as
  `least-tokens`. So chats behind one system prompt keep finding it in the same engine's prefix
  cache, and a workload with no shared prefixes is routed exactly as `least-tokens` routes it.
- `p2c`: the lesser loaded of two drawn at random (a seeded generator: the same events, the same
  choices); `round-robin`: the next in turn.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tailguard.front.ejection import Ejector
from tailguard.front.params import ClassSpec, RoutingParams
from tailguard.front.prefix import PrefixIndex
from tailguard.front.queue import Pending
from tailguard.front.slots import BackendPool, BackendState

# A request's size when nothing better is known: what the engine reports beyond the gateway's
# own requests is counted in requests, and weighed as this many tokens each.
_DEFAULT_REQUEST_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Route:
    """What routing needs of a request beyond its place in the queue: the model it names (None:
    any backend) and its prompt's chained block hashes (`front.prefix`)."""

    model: str | None = None
    prefix: Sequence[int] = ()


NO_ROUTE = Route()


class Router:
    """The routing policy and what it remembers (where prefixes went, whose turn it is)."""

    def __init__(self, params: RoutingParams, ejector: Ejector) -> None:
        self.params = params
        self._ejector = ejector
        self._index = PrefixIndex(params.index_blocks)
        self._rng = random.Random(params.seed)
        self._turn = 0

    def reconfigure(self, params: RoutingParams) -> None:
        if params.index_blocks != self.params.index_blocks:
            self._index = PrefixIndex(params.index_blocks)
        self.params = params

    def forget(self, backend: str) -> None:
        self._index.forget(backend)

    # --- which backends may take it -------------------------------------------------------------

    def serving(self, slots: BackendPool, cls: ClassSpec, route: Route) -> list[BackendState]:
        """Backends that serve the request's model in its class's pools, whatever their health."""
        pools = cls.pools
        return [s for s in slots if not s.retiring and (not pools or s.cfg.pool in pools) and s.serves(route.model)]

    def usable(self, slots: BackendPool, members: list[BackendState]) -> list[BackendState]:
        """The healthy ones of `members` a request may go to: those not ejected, unless fewer than
        `panic_threshold` of the healthy would be left (then ejections are ignored)."""
        healthy = [s for s in members if s.healthy]
        kept = [s for s in healthy if not self._ejector.ejected(s.name)]
        if len(kept) < self._ejector.params.panic_threshold * len(healthy):
            return healthy
        return kept

    # --- the choice -----------------------------------------------------------------------------

    def choose(self, slots: BackendPool, cls: ClassSpec, pending: Pending, route: Route, now: float,
               exclude: Collection[str] = ()) -> str | None:
        """The backend for `pending`, or None when none that may take it has room for its class."""
        usable = self.usable(slots, self.serving(slots, cls, route))
        for pool in cls.pools or (None,):
            cands = [s for s in usable if (pool is None or s.cfg.pool == pool) and s.name not in exclude
                     and slots.has_capacity(s.name, pending.cls)]
            if cands:
                return self._pick(cands, route, now).name
        return None

    def bound(self, backend: str, route: Route) -> None:
        """A request of `route` was sent to `backend`: the engine's prefix cache will hold its
        prompt, and the turn moves on."""
        self._turn += 1
        if route.prefix and self.params.policy == "prefix-affinity":
            self._index.served(route.prefix, backend)

    def _pick(self, cands: list[BackendState], route: Route, now: float) -> BackendState:
        policy = self.params.policy
        if len(cands) == 1:
            return cands[0]
        if policy == "round-robin":
            return cands[self._turn % len(cands)]
        mean = _mean_tokens(cands)
        if policy == "p2c":
            a, b = self._rng.sample(cands, 2)
            return a if self._load(a, mean, now) <= self._load(b, mean, now) else b
        least = min(cands, key=lambda s: (self._load(s, mean, now), s.last_acquired))
        if policy == "prefix-affinity" and route.prefix:
            held = self._affine(cands, route)
            if held is not None and held is not least:
                p = self.params
                slack = p.balance_slack * mean / _capacity(held)
                if self._load(held, mean, now) <= p.balance_factor * self._load(least, mean, now) + slack:
                    return held
        return least

    def _affine(self, cands: list[BackendState], route: Route) -> BackendState | None:
        """The candidate that served the longest part of this prompt, if that part is a
        meaningful share of it."""
        name, n = self._index.longest(route.prefix)
        if name is None or n < self.params.min_prefix_share * len(route.prefix):
            return None
        for s in cands:
            if s.name == name:
                return s
        return None

    def _load(self, s: BackendState, mean: float, now: float) -> float:
        """Estimated tokens in flight per unit of capacity, with the engine's own extra work."""
        tokens = float(s.tokens)
        read_at = s.engine_read_at
        if read_at is not None and now - read_at <= self.params.engine_load_ttl_s:
            extra = s.engine_queued - s.in_flight
            if extra > 0:
                tokens += extra * mean
        return tokens / _capacity(s)


def _capacity(s: BackendState) -> float:
    return s.cfg.max_concurrency * s.cfg.weight


def _mean_tokens(cands: list[BackendState]) -> float:
    """The mean job size of the requests in flight on `cands` (a default when none are)."""
    n = sum(s.in_flight for s in cands)
    return sum(s.tokens for s in cands) / n if n else float(_DEFAULT_REQUEST_TOKENS)
