"""Where a request goes: among the backends that may take it, the one its routing policy picks;
pure, no I/O.

A backend may take a request when it serves the request's model, belongs to one of its class's
pools (tried in order: the first pool with a backend that has room wins), is healthy, not retiring,
not ejected (unless so many are that the pool is in panic: `front.ejection`), not excluded (a
retry's earlier backends) and has a slot its class may take (`front.slots`). Among those:

- `least-tokens`: the least load, where load is the estimated tokens in flight there (prompt +
  output of each request it runs) and this request's own, plus what the engine itself reports
  running and waiting beyond the gateway's own requests (other clients' work; a reading older
  than `engine_load_ttl_s` counts as none), over its capacity: its cap in force (`max_concurrency`,
  or its adaptive cap) x `weight` x its speed. Speed is 1 unless the backend has served clearly slower than its peers: seconds per
  estimated token (a running average over at least `slow_min_samples` requests, the latest within
  `slow_ttl_s`) more than `slow_factor` x the candidates' median; then the median over its own.
  So a host that serves 5x slower gets a request only when its peers hold 5x its work (less
  traffic, never cut off); peers within the factor of each other share alike, so noise in the
  averages never skews an even fleet; and a reading gone stale is forgotten, so a host that was
  slow once is tried again.
  SGLang's model gateway's `least_load` scores alike, (queued + in-flight tokens) / throughput.
  Ties go to the backend bound least recently, which spreads an idle fleet round-robin.
- `prefix-affinity` (the default): the backend that served the longest part of this prompt
  (`front.prefix`), while it holds at least `min_prefix_share` of it and its load is within
  `balance_factor` x the least loaded's plus `balance_slack` requests' worth; else as
  `least-tokens`. So chats behind one system prompt keep finding it in the same engine's prefix
  cache, and a workload with no shared prefixes is routed exactly as `least-tokens` routes it.
- `predicted-ttft`: the backend where the request's first token is predicted to come soonest
  (`front.latency`: each backend's fit of TTFT from its uncached prefill, its running requests and
  their tokens), with prefix hits priced in as the prompt tokens its cache saves (the prefix index
  is the model's input here, not a rule of its own). Until every candidate's fit predicts, as
  `prefix-affinity`. llm-d's router scores endpoints by predicted latency alike.
- `p2c`: the lesser loaded of two drawn at random (a seeded generator: the same events, the same
  choices); `round-robin`: the next in turn.

Program affinity comes first, under every policy but `round-robin` (before `predicted-ttft`'s
choice too): a call of an agent program
(`Route.program`) goes to the backend its program's last call went to (`front.programs`: while
that call's KV is trusted to be there), if that backend may take it and its load is within the
bound prefix affinity uses (`balance_factor` x the least loaded's plus `balance_slack`); so a
program's growing context keeps finding the cache that holds it, and sibling calls that arrive
together land together, without hashing its prompt (Dynamo's and vLLM's routers keep an agent
session on one worker alike).

A backend whose probes (or engine metrics) have gone stale, read once and not since within
`stale_after_s`, counts as saturated under every load-based policy: it is chosen only when no
other backend may take the request (llm-d's choice; `BackendView.stale`, the gauge
`tailguard_backend_stale`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from tailguard.front.ejection import Ejector
from tailguard.front.latency import Features, Latency
from tailguard.front.params import ClassSpec, RoutingParams
from tailguard.front.prefix import PrefixIndex
from tailguard.front.programs import ProgramBook
from tailguard.front.queue import Pending
from tailguard.front.slots import BackendPool, BackendState
from tailguard.wire.prefix import BLOCK_CHARS

# The prompt tokens one prefix hash stands for (`wire.prefix`: a block of characters, about a
# quarter as many tokens by the gateway's estimate; the DES hands the same stride).
PREFIX_BLOCK_TOKENS = BLOCK_CHARS // 4

# A request's size when nothing better is known: what the engine reports beyond the gateway's
# own requests is counted in requests, and weighed as this many tokens each.
_DEFAULT_REQUEST_TOKENS = 512
# The least share of its capacity a slow backend keeps: however slow it measured, it is never cut off.
_MIN_SPEED = 0.05


@dataclass(frozen=True, slots=True)
class Route:
    """What routing needs of a request beyond its place in the queue: the model it names (None:
    any backend) and its prompt's chained block hashes (`front.prefix`)."""

    model: str | None = None
    prefix: Sequence[int] = ()
    pin: str | None = None  # the backend that holds the request's state (`Arrive.pin`)
    program: str | None = None  # the agent program it is a call of (`Arrive.program`)
    prompt_tokens: int = 0  # what its first token costs to compute where no cache holds it


NO_ROUTE = Route()


class Router:
    """The routing policy and what it remembers (where prefixes went, whose turn it is)."""

    def __init__(self, params: RoutingParams, ejector: Ejector, latency: Latency | None = None,
                 programs: ProgramBook | None = None) -> None:
        self.params = params
        self._ejector = ejector
        self._programs = programs  # where each program's last call went (None: no program affinity)
        self._latency = latency if latency is not None else Latency()
        self._index = PrefixIndex(params.index_blocks)
        self._rng = random.Random(params.seed)
        self._turn = 0

    def reconfigure(self, params: RoutingParams) -> None:
        if params.index_blocks != self.params.index_blocks:
            self._index = PrefixIndex(params.index_blocks)
        self.params = params

    def forget(self, backend: str) -> None:
        self._index.forget(backend)

    # --- what a start costs --------------------------------------------------------------------

    def hits(self, route: Route) -> Mapping[str, int]:
        """For each backend, the leading prefix blocks of the request its cache is expected to hold."""
        return self._index.hits(route.prefix) if route.prefix else {}

    def features(self, s: BackendState, route: Route, hits: Mapping[str, int], now: float,
                 waits: bool = False) -> Features:
        """What a start of the request on `s` looks like to the latency fit: its uncached prompt
        with the prefill `s` still owes the requests started before it, the requests running there (with the engine's own beyond the gateway's, while its reading
        is fresh) and their tokens. `waits`: it starts once a slot frees (at most `cap - 1` others)."""
        prefill = max(0, route.prompt_tokens - hits.get(s.name, 0) * PREFIX_BLOCK_TOKENS)
        running = s.in_flight
        read_at = s.engine_read_at
        if read_at is not None and now - read_at <= self.params.engine_load_ttl_s:
            running = max(running, s.engine_queued)
        if waits:
            running = min(running, s.cap - 1)
        return float(prefill), float(running), float(s.tokens), self._latency.pending(s.name)

    def predicted_s(self, s: BackendState, route: Route, hits: Mapping[str, int], now: float,
                    waits: bool = False) -> float | None:
        """The request's TTFT once started on `s` (inf while `s` is stale; None: not fitted yet)."""
        if self.stale(s, now):
            return math.inf
        return self._latency.predict(s.name, self.features(s, route, hits, now, waits))

    def stale(self, s: BackendState, now: float) -> bool:
        """Its probes or engine metrics were read once and not since within `stale_after_s`."""
        limit = self.params.stale_after_s
        probed, read = s.probed_at, s.engine_read_at
        return (probed is not None and now - probed > limit) or (read is not None and now - read > limit)

    # --- which backends may take it -------------------------------------------------------------

    def serving(self, slots: BackendPool, cls: ClassSpec, route: Route) -> list[BackendState]:
        """Backends that may serve the request's model in its class's pools, whatever their
        health (`tiers`, flattened)."""
        return [s for tier in self.tiers(slots, cls, route) for s in tier]

    def tiers(self, slots: BackendPool, cls: ClassSpec, route: Route) -> list[list[BackendState]]:
        """Those backends in the order they are tried: known to serve the model first, then those
        whose models are not known (yet: the first moments after a start, before each backend's
        /v1/models is read; or never, a server that lists none). A backend known not to serve the
        model is never among them, in a fleet of one model as in any other: the name a client
        sends is checked as `/v1/models` lists it (`aliases` add names)."""
        pools = cls.pools
        model = route.model
        members = [s for s in slots if not s.retiring and (not pools or s.cfg.pool in pools)]
        pinned = [s for s in members if s.name == route.pin]
        if pinned:  # its state is there; a pin to a backend that has left binds nothing
            members = pinned
        if model is None:
            return [members]
        found = [s for s in members if s.serves(model)]
        known = [s for s in found if s.knows_models()]
        if known:
            return [known, [s for s in found if not s.knows_models()]]
        return [found]

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
        tiers = self.tiers(slots, cls, route)
        kept = {s.name for s in self.usable(slots, [s for tier in tiers for s in tier])}  # one panic judgement
        for tier in tiers:
            for pool in cls.pools or (None,):
                cands = [s for s in tier if s.name in kept and (pool is None or s.cfg.pool == pool)
                         and s.name not in exclude and slots.has_capacity(s.name, pending.cls)]
                if cands:
                    return self._pick(cands, route, pending.est_tokens, now).name
        return None

    def bound(self, backend: str, route: Route) -> None:
        """A request of `route` was sent to `backend`: the engine's prefix cache will hold its
        prompt, and the turn moves on."""
        self._turn += 1
        if route.prefix and self.params.policy in _INDEXED:
            self._index.served(route.prefix, backend)

    def _pick(self, cands: list[BackendState], route: Route, size: int, now: float) -> BackendState:
        policy = self.params.policy
        if len(cands) == 1:
            return cands[0]
        if policy == "round-robin":
            return cands[self._turn % len(cands)]
        mean = _mean_tokens(cands)
        ref = self._median_cost(cands, now)

        def load(s: BackendState) -> float:
            return self._load(s, size, mean, ref, now)

        least = min(cands, key=lambda s: (load(s), s.last_acquired))
        home = self._home(cands, route, now)
        if home is not None and self._within(home, least, load, mean, ref, now):
            return home
        if policy == "p2c":
            a, b = self._rng.sample(cands, 2)
            return a if load(a) <= load(b) else b
        if policy == "predicted-ttft":
            fastest = self._fastest(cands, route, now)
            if fastest is not None:
                return fastest
        if policy in _INDEXED and route.prefix:
            held = self._affine(cands, route)
            if held is not None and self._within(held, least, load, mean, ref, now):
                return held
        return least

    def _within(self, held: BackendState, least: BackendState, load: Callable[[BackendState], float],
                mean: float, ref: float | None, now: float) -> bool:
        """Whether an affine backend's load is within the bound: `balance_factor` x the least
        loaded's, plus `balance_slack` requests' worth."""
        if held is least:
            return True
        p = self.params
        slack = p.balance_slack * mean / self._capacity(held, ref, now)
        return load(held) <= p.balance_factor * load(least) + slack

    def _home(self, cands: list[BackendState], route: Route, now: float) -> BackendState | None:
        """The candidate that took the last call of the request's program, if any."""
        if route.program is None or self._programs is None:
            return None
        name = self._programs.home(route.program, now)
        if name is None:
            return None
        for s in cands:
            if s.name == name:
                return s
        return None

    def _fastest(self, cands: list[BackendState], route: Route, now: float) -> BackendState | None:
        """The candidate with the least predicted TTFT (ties: bound least recently), or None while
        any candidate's fit predicts nothing (each gets its first samples as `prefix-affinity`
        spreads them)."""
        hits = self.hits(route)
        best: tuple[float, int] | None = None
        chosen = None
        for s in cands:
            t = self.predicted_s(s, route, hits, now)
            if t is None:
                return None
            if best is None or (t, s.last_acquired) < best:
                best, chosen = (t, s.last_acquired), s
        return chosen

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

    def _median_cost(self, cands: list[BackendState], now: float) -> float | None:
        """The lower median of the trustworthy costs: with two backends, the faster one's."""
        costs = sorted(c for s in cands if (c := self._cost(s, now)) is not None)
        return costs[(len(costs) - 1) // 2] if costs else None

    def _cost(self, s: BackendState, now: float) -> float | None:
        """Its running cost per token, if trustworthy: enough samples, recent enough."""
        p = self.params
        if s.cost is None or s.cost_samples < p.slow_min_samples or now - s.cost_at > p.slow_ttl_s:
            return None
        return s.cost

    def _capacity(self, s: BackendState, ref: float | None, now: float) -> float:
        """Slots x weight x speed: the reference cost over its own, where it is more than
        `slow_factor` x the reference; else 1."""
        cap = s.cap * s.cfg.weight
        if ref is None:
            return cap
        cost = self._cost(s, now)
        if cost is None or cost <= self.params.slow_factor * ref:
            return cap
        return cap * max(_MIN_SPEED, ref / cost)

    def _load(self, s: BackendState, size: int, mean: float, ref: float | None, now: float) -> float:
        """Estimated tokens in flight with this request's `size`, per unit of capacity, with the
        engine's own extra work; a stale backend's is infinite."""
        if self.stale(s, now):
            return math.inf
        tokens = float(s.tokens + size)
        read_at = s.engine_read_at
        if read_at is not None and now - read_at <= self.params.engine_load_ttl_s:
            extra = s.engine_queued - s.in_flight
            if extra > 0:
                tokens += extra * mean
        return tokens / self._capacity(s, ref, now)


# The policies that remember where prefixes went.
_INDEXED = ("prefix-affinity", "predicted-ttft")
def _mean_tokens(cands: list[BackendState]) -> float:
    """The mean job size of the requests in flight on `cands` (a default when none are)."""
    n = sum(s.in_flight for s in cands)
    return sum(s.tokens for s in cands) / n if n else float(_DEFAULT_REQUEST_TOKENS)
