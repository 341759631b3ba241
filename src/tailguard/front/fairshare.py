"""Token-fair sharing between callers: a virtual token counter per caller, in the spirit of VTC
(Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024; the artifact's
`slora/server/router/vtc_req_queue.py`); pure, no I/O.

Each caller's counter grows by the service it is given, divided by its weight: prompt tokens at
`input_price`, generated tokens at `output_price` (VTC's defaults: 1 and 2). Among callers with
requests waiting, the one with the least counter goes next, so backlogged callers are served in
proportion to their weights. A caller that comes back from idle is lifted to the least counter
of those still waiting less a `credit` (VTC's lift has none), so it cannot be starved for its idle
time and banks at most `credit` of it: enough that a caller under its share gets a Poisson burst
through ahead of one that floods (which is backlogged, so never lifted), rather than an equal
share of the slots during each burst (`benchmarks/fair_share.py`).

A gateway learns what a request generated only as it ends, so a dispatch charges what it is
expected to cost (its prompt and its capped output limit) and its end corrects that to what it
really used, the prediction-then-correction variant the VTC paper describes for systems that
do not see each token.

Replicas that share state (`gateway.shared.fair`) keep one set of counters between them: each
takes the service it gave (`take_served`, charges and corrections, not lifts, which are each
queue's own) and adds what the others gave (`absorb`), so a caller that floods one replica waits
behind the others' callers on every replica.

    vtc = VirtualCounters(weights={"team-a": 2.0}, credit=8192)
    vtc.arrived("team-a", backlogged=["team-b"])    # lifted to team-b's counter - 8192 if below
    vtc.dispatched("r1", "team-a", prompt_tokens=300, output_tokens=200)
    vtc.ended("r1", used_tokens=410)                # 300 prompt + 110 generated, not 200
    order = vtc.least(["team-a", "team-b"])         # who goes next
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ANONYMOUS = ""  # the counter of requests with no caller (no keys configured)


class VirtualCounters:
    """Per-caller virtual token counters with weights (see the module docstring)."""

    def __init__(self, weights: Mapping[str, float] | None = None, input_price: float = 1.0,
                 output_price: float = 2.0, credit: float = 0.0) -> None:
        self.weights = dict(weights or {})
        self.credit = credit
        self.input_price, self.output_price = input_price, output_price
        self.counters: dict[str, float] = {}
        self._charged: dict[str, tuple[str, int, float]] = {}  # request -> (caller, prompt, charged)
        self._served: dict[str, float] = {}  # service given here since the last `take_served`

    def counter(self, caller: str) -> float:
        return self.counters.get(caller, 0.0)

    def arrived(self, caller: str, backlogged: Iterable[str]) -> None:
        """`caller` has requests waiting again, after none: lift it to the least counter of the
        callers in `backlogged` (the others with requests waiting), less the credit."""
        floor = min((self.counters.get(c, 0.0) for c in backlogged if c != caller), default=None)
        if floor is not None and floor - self.credit > self.counters.get(caller, 0.0):
            self.counters[caller] = floor - self.credit

    def least(self, callers: Iterable[str]) -> list[str]:
        """`callers` in the order they should be served: least counter first, ties by name."""
        return sorted(callers, key=lambda c: (self.counters.get(c, 0.0), c))

    def cost(self, caller: str, prompt_tokens: int, output_tokens: int) -> float:
        """What serving that many tokens adds to `caller`'s counter."""
        return (prompt_tokens * self.input_price + output_tokens * self.output_price) / self._weight(caller)

    def dispatched(self, req_id: str, caller: str, prompt_tokens: int, output_tokens: int) -> None:
        """Request `req_id` of `caller` got a slot: charge what it is expected to cost. Once per
        request (a resumed or retried run is the same request)."""
        if req_id in self._charged:
            return
        cost = self.cost(caller, prompt_tokens, output_tokens)
        self._serve(caller, cost)
        self._charged[req_id] = (caller, prompt_tokens, cost)

    def ended(self, req_id: str, used_tokens: int) -> None:
        """Request `req_id` ended having used `used_tokens` (prompt and generated; 0 when no
        engine answered it): its charge becomes what it really cost."""
        charged = self._charged.pop(req_id, None)
        if charged is None:
            return  # never dispatched: it cost nothing
        caller, prompt, cost = charged
        used = max(0, used_tokens)
        self._serve(caller, self.cost(caller, min(prompt, used), max(0, used - prompt)) - cost)

    def take_served(self) -> dict[str, float]:
        """The service given here to each caller since the last call (what other replicas are
        to add to their counters)."""
        served, self._served = self._served, {}
        return served

    def absorb(self, others: Mapping[str, float]) -> None:
        """Other replicas gave each caller this much service since the last exchange."""
        for caller, amount in others.items():
            self.counters[caller] = self.counters.get(caller, 0.0) + amount

    def _serve(self, caller: str, amount: float) -> None:
        self.counters[caller] = self.counters.get(caller, 0.0) + amount
        self._served[caller] = self._served.get(caller, 0.0) + amount

    def keep(self, old: VirtualCounters) -> None:
        """A reload: `old`'s counters and what each request in flight was charged carry over;
        this one's weights, prices and credit apply to what is charged from now."""
        self.counters = old.counters
        self._charged = old._charged
        self._served = old._served

    def _weight(self, caller: str) -> float:
        return self.weights.get(caller, 1.0)
