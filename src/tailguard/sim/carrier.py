"""The requests' side of a discrete-event run (`sim.des`): each arrival handed to the front (or,
without one, straight to the engine), the front's decisions carried out on the engine models
(start, hedge, suspend, drop, reject, give up), an attempt's failure told back, and each request's
end with the follow-ups it sends; pure, no I/O. What happens to the hosts themselves is
`sim.fleet`'s; the loop that advances the clock is `sim.des`'s.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from tailguard.clock import VirtualClock
from tailguard.front.counts import COUNTED_DECISIONS
from tailguard.front.events import (
    Decision, Drop, Ejected, Event, Failed, Finished, GiveUp, HealthChanged, Opened, Readmitted, Reject, Retired,
    Start, StartMode, Suspend, Wait,
)
from tailguard.front.front import Front
from tailguard.front.samples import sample
from tailguard.sim.agenda import HEADER_DEADLINE, Agenda, HeaderDeadline
from tailguard.sim.engine import RequestFinished, SimRequest
from tailguard.sim.live import Autoscaler, LiveHost, LiveRequest
from tailguard.sim.scenario import Arrival, FollowUp, Gate, Host, Tap, Timeline
from tailguard.types import FailureKind, Outcome

# What the DES does with each decision (`_apply`): all of them, but those that say something of a
# backend to the gateway's probes, gauges and logs, which a simulated fleet has none of. The
# decisions about a request are counted on its timeline (`front.counts.COUNTED_DECISIONS`).
CARRIED: dict[type, str] = {Start: "_carry_start", Suspend: "_suspend", Drop: "_drop", GiveUp: "_give_up",
                            Reject: "_carry_reject"}
NOT_APPLICABLE: dict[type, str] = {
    Wait: "the request stays in `waiting` (set as it failed) until its next Start",
    HealthChanged: "health is the front's; the DES has no probe loop or gauge to move",
    Ejected: "ejection is the front's; the DES has no log or gauge to tell",
    Readmitted: "ejection is the front's; the DES has no log or gauge to tell",
    Retired: "a host a scaling run adds never leaves, so none retires",
}


class Carrier:
    """One run's state and its requests' side; a class so the hot loop reads attributes, not
    closures. `sim.fleet.Fleet` adds what happens to the hosts, `sim.des.Driver` the loop."""

    def __init__(
        self, hosts: Sequence[Host], clock: VirtualClock, front: Front | None,
        by_id: dict[str, Timeline], pending: list[tuple[float, int, Arrival]], record: bool, header_timeout_s: float,
    ) -> None:
        self.hosts = {h.name: LiveHost(h) for h in hosts}
        self.clock = clock
        self.front = front
        self.by_id = by_id
        self.pending = pending  # arrivals to come: a heap of (at, sequence, arrival)
        self.record = record
        self.header_timeout_s = header_timeout_s
        # Step ends, header deadlines, deaths, revivals and probes.
        self.agenda = Agenda()
        self.stepping = 0  # hosts with a step in flight
        self.waiting: dict[str, Arrival] = {}  # in the front, waiting for a Start
        self.max_model_len = max(h.engine.config.max_model_len for h in hosts)
        self.live: dict[str, LiveRequest] = {}  # front-dispatched requests not ended
        self.tracked: dict[str, LiveRequest] = {}  # those of them that may be suspended
        self.kv_keys = 0  # the next kv_key to give a preemptible request
        self.follow_up: FollowUp | None = None
        self.gate: Gate | None = None
        self.timelines: list[Timeline] = []
        self.scaler: Autoscaler | None = None
        self.watch: Callable[[float, Front], None] | None = None
        self.tap: Tap | None = None
        self._carry: dict[type, Callable[[Any, float], Sequence[Decision]]] = {
            kind: getattr(self, name) for kind, name in CARRIED.items()}
        # The backends whose cap learns from their requests' latency: told `Observed` as each ends.
        self.adaptive = frozenset(() if front is None else (b.name for b in front.params.backends if b.adaptive))

    def tell(self, event: Event, now: float, preempt: bool = True) -> Sequence[Decision]:
        """Hand the front one event: the one place the run does (and the tap hears it)."""
        front = self.front
        assert front is not None
        decisions = front.handle(event, now, preempt=preempt)
        if self.tap is not None:
            self.tap(event, now, preempt, decisions)
        return decisions

    # --- arrivals ---------------------------------------------------------------------------------

    def _arrive(self, a: Arrival) -> None:
        t = a.at
        tl = self.by_id[a.id]
        if self.gate is not None:
            a = self.gate.admit(a)
            tl.cls, tl.max_tokens = a.cls, a.max_tokens
        if a.refused is not None:
            self._end(tl, Outcome.CLIENT_ERROR, a.refused, t, status=a.refused_status)
            return
        if a.prompt_tokens + a.max_tokens > self.max_model_len or a.prompt_tokens < 1 or a.max_tokens < 1:
            self._end(tl, Outcome.CLIENT_ERROR, "context_length", t)
            return
        front = self.front
        if front is None:
            [h] = self.hosts.values()
            tl.dispatched_at, tl.backend = t, h.name
            h.engine.add(SimRequest(a.id, a.prompt_tokens, a.max_tokens, a.priority, a.block_hashes), t)
            return
        self.waiting[a.id] = a
        self._apply(self.tell(a.arrive(), t, preempt=not self.stepping))

    # --- the front's decisions, carried out -------------------------------------------------------

    def _apply(self, decisions: Sequence[Decision]) -> None:
        """Carry out the front's decisions (and those they lead to) on the engine models, each by
        its method in `CARRIED`, and count those about a request on its timeline as the gateway
        counts them (`front.counts`)."""
        if not decisions:
            return
        todo: deque[Decision] = deque(decisions)
        t = self.clock.now()
        carry = self._carry
        while todo:
            d = todo.popleft()
            kind = type(d)
            if kind in COUNTED_DECISIONS:
                self.by_id[d.id].counts.apply(d)  # type: ignore[union-attr]
            method = carry.get(kind)
            if method is not None:
                todo.extend(method(d, t))

    def _carry_start(self, d: Start, t: float) -> Sequence[Decision]:
        """A hedge's second attempt, or a start of any other mode (its engine then has it, and
        the front is told `Opened` when the request may be suspended)."""
        front = self.front
        assert front is not None
        if d.mode is StartMode.HEDGE:
            self._send(d.id, self.live[d.id], self.hosts[d.backend], t, hedge=True)
        elif self._start(d, t):
            return self.tell(Opened(d.id), t, preempt=not self.stepping)
        return ()

    def _start(self, d: Start, t: float) -> bool:
        """Send a request where the front says: True when its engine took it, its upstream is
        open and it may be suspended (the front is told `Opened`)."""
        a = self.waiting.pop(d.id)
        front = self.front
        assert front is not None
        lv = self.live.get(d.id)
        if lv is None:
            tracked = front.tracks(a.cls, a.resumable)
            lv = self.live[d.id] = LiveRequest(a, self.kv_keys if tracked else None)
            if tracked:
                self.tracked[d.id] = lv
                self.kv_keys += 1
        tl = self.by_id[d.id]
        if tl.dispatched_at is None:
            tl.dispatched_at = t
        return self._send(d.id, lv, self.hosts[d.backend], t, hedge=False) and lv.kv_key is not None

    def _send(self, rid: str, lv: LiveRequest, h: LiveHost, t: float, hedge: bool) -> bool:
        """An attempt of `rid` at `h` (its only one, or a hedge's second): True when the engine
        took it. It answers in the order the simulator's server does: refused when dead, then
        a hang, a drawn 500, the engine's 404."""
        lv.tries += 1
        if hedge:
            lv.hedge, lv.hedge_attempt = h, lv.tries
        else:
            lv.host, lv.attempt = h, lv.tries
            self.by_id[rid].backend = h.name
        a = lv.arrival
        if h.dead:
            self._fail(rid, lv, h, FailureKind.CONNECT, False, 0, t)
            return False
        if h.faults.hangs(True, t):
            self.agenda.schedule(t + self.header_timeout_s, HEADER_DEADLINE, HeaderDeadline(rid, lv.tries))
            return False
        if h.errors.fails(t):
            self._fail(rid, lv, h, FailureKind.STATUS, True, 0, t)
            return False
        if a.model is not None and h.models and a.model not in h.models:
            self._refuse(rid, "model_not_found", t)
            return False
        done = lv.base_tokens
        req = SimRequest(a.id, a.prompt_tokens + done, a.max_tokens - done, a.priority, a.block_hashes, lv.kv_key)
        try:
            h.engine.add(req, t)
        except ValueError:  # past this engine's context length (a fleet's engines may differ)
            self._refuse(rid, "context_length", t)
            return False
        return True

    def _carry_reject(self, d: Reject, t: float) -> Sequence[Decision]:
        self.waiting.pop(d.id, None)
        self._forget(d.id)
        self._end(self.by_id[d.id], Outcome.REJECTED, d.reason, t, d.retry_after_s)
        return ()

    def _suspend(self, d: Suspend, t: float) -> Sequence[Decision]:
        req_id = d.id
        lv = self.live[req_id]
        h = lv.host
        assert h is not None
        lv.base_tokens += h.produced(req_id)
        self._abort(h, req_id, t)
        lv.host = None
        self.waiting[req_id] = lv.arrival
        return ()

    def _drop(self, d: Drop, t: float) -> Sequence[Decision]:
        """A hedge is over: the attempt at `d.winner` is the request's from now on; the one at
        `d.loser` stops now (one that failed has stopped already)."""
        lv = self.live[d.id]
        loser = self.hosts[d.loser]
        if loser is lv.host:
            lv.promote_hedge()
            assert lv.host is not None
            self.by_id[d.id].backend = lv.host.name
        else:
            lv.hedge = None
        if not d.failed:
            self._abort(loser, d.id, t)
        return ()

    @staticmethod
    def _abort(h: LiveHost, req_id: str, t: float) -> None:
        """Stop `req_id` in `h`'s engine; mid-step, that step delivers nothing more to it."""
        if h.step is not None:
            h.cut.add(req_id)
        h.engine.abort(req_id, t)

    # --- failures ---------------------------------------------------------------------------------

    def _fail(self, rid: str, lv: LiveRequest, h: LiveHost, kind: FailureKind, answered: bool, produced: int,
              t: float) -> None:
        """The attempt at `h` failed after `produced` tokens; the front decides what follows. Of
        a hedged request, the other attempt goes on (`Drop` of this one); else it goes again
        (`Start`), waits for a backend (`Wait`), or ends here as an upstream error with what it
        had generated (`GiveUp`)."""
        front = self.front
        assert front is not None
        self.by_id[rid].failures += 1
        if lv.hedge is not None:
            self._apply(self.tell(Failed(rid, kind, False, answered, h.name), t, preempt=not self.stepping))
            return
        lv.base_tokens += produced
        lv.host = None
        self.waiting[rid] = lv.arrival
        self._apply(self.tell(Failed(rid, kind, lv.base_tokens > 0, answered), t, preempt=not self.stepping))

    def _give_up(self, d: GiveUp, t: float) -> Sequence[Decision]:
        """The front will not try `d.id` again: it ends as an upstream error (a timeout for a
        deadline) with what it had generated, and the front is told it ended."""
        front = self.front
        assert front is not None
        rid = d.id
        self.waiting.pop(rid, None)
        tl, lv = self.by_id[rid], self.live[rid]
        tl.output_tokens = lv.base_tokens
        self._forget(rid)
        outcome = Outcome.TIMEOUT if d.kind.is_timeout else Outcome.UPSTREAM_ERROR
        self._observe(tl, t, lv.base_tokens)
        self._apply(self.tell(Finished(rid, outcome, tl.prompt_tokens + lv.base_tokens), t))
        self._end(tl, outcome, d.kind.value, t)
        return ()

    def _refuse(self, rid: str, reason: str, t: float) -> None:
        """The engine answered `rid` with a 4xx (a model it does not serve, a context too long
        for it): the request ends as a client error, and its backend is alive."""
        front = self.front
        assert front is not None
        lv = self.live.get(rid)
        if lv is not None and lv.hedge is not None:  # the other attempt stops with it
            for h in (lv.host, lv.hedge):
                if h is not None:
                    self._abort(h, rid, t)
        self._forget(rid)
        self._apply(self.tell(Finished(rid, Outcome.CLIENT_ERROR, 0), t))
        self._end(self.by_id[rid], Outcome.CLIENT_ERROR, reason, t)

    # --- ends and follow-ups ----------------------------------------------------------------------

    def _finished(self, tl: Timeline, ev: RequestFinished, end: float) -> None:
        tl.finished_at = end
        tl.output_tokens = ev.output_tokens
        tl.finish_reason = ev.finish_reason
        tl.outcome = Outcome.SUCCESS
        if self.live:
            lv = self.live.pop(ev.req_id, None)
            if lv is not None:
                tl.output_tokens += lv.base_tokens
                self.tracked.pop(ev.req_id, None)
        if self.front is not None:
            # No preemption yet: another request of this step may be told its end next, and must
            # not be suspended first; the step's Tick lets the front preempt once all are in.
            self._observe(tl, end, ev.output_tokens)
            tokens = tl.prompt_tokens + tl.output_tokens
            self._apply(self.tell(Finished(ev.req_id, Outcome.SUCCESS, tokens), end, preempt=False))
        if self.gate is not None:
            self.gate.finished(tl)
        self._ended(tl, end)
        if self.follow_up is not None:
            self._follow(tl, end)

    def _observe(self, tl: Timeline, end: float, chunks: int) -> None:
        """A request on an adaptive backend ended: what it showed of its backend's latency between
        tokens, as the gateway's dispatcher tells it (`front.samples`). Its last token came at
        its end."""
        front = self.front
        assert front is not None
        if tl.backend not in self.adaptive:
            return
        seen = sample(tl.backend, tl.first_token_at, end, chunks, tl.counts)
        if seen is not None:
            self._apply(self.tell(seen, end, preempt=False))

    def _end(self, tl: Timeline, outcome: Outcome, reason: str, t: float, retry_after_s: float | None = None,
             status: int = 400) -> None:
        """`tl` ends refused (`outcome` REJECTED, a 503) or as a client error (its `status`)."""
        tl.outcome, tl.reject_reason, tl.finished_at, tl.retry_after_s = outcome, reason, t, retry_after_s
        tl.status = status if outcome is Outcome.CLIENT_ERROR else None
        self._ended(tl, t)
        if self.follow_up is not None:
            self._follow(tl, t)

    def _ended(self, tl: Timeline, t: float) -> None:
        """A request ended: the capacity signal counts it (its service time, if it ran)."""
        if self.scaler is not None:
            service_s = None if tl.dispatched_at is None else t - tl.dispatched_at
            self.scaler.capacity.ended(tl.backend, tl.cls, t, service_s)

    def _forget(self, rid: str) -> None:
        self.live.pop(rid, None)
        self.tracked.pop(rid, None)

    def _follow(self, tl: Timeline, t: float) -> None:
        assert self.follow_up is not None
        sent = self.follow_up(tl, t)
        for a in (() if sent is None else (sent,) if isinstance(sent, Arrival) else sent):
            self._sent(tl, a, t)

    def _sent(self, tl: Timeline, a: Arrival, t: float) -> None:
        """`a`, sent as `tl`'s request ended at `t`, comes in (now, or through the heap)."""
        if a.id in self.by_id:
            raise ValueError(f"duplicate arrival id {a.id!r}")
        new = Timeline(a.id, a.cls, a.at, a.prompt_tokens, a.max_tokens)
        if self.record:
            new.token_times = []
        self.by_id[a.id] = new
        self.timelines.append(new)
        if a.at > t or tl.outcome is Outcome.CLIENT_ERROR:
            # after every given index; one refused at once comes through the heap, so a client
            # refused over and over (a class the gateway does not know) loops instead of recursing
            heapq.heappush(self.pending, (a.at, len(self.by_id), a))
        elif tl.outcome is Outcome.REJECTED:
            raise ValueError(f"the follow-up of refused request {tl.id!r} comes at the same instant: a client "
                             f"must wait before retrying (it was told Retry-After {tl.retry_after_s} s)")
        else:
            self._arrive(a)

    def _all_done(self) -> bool:
        """Nothing is left to arrive, wait or run: deaths and probes no longer matter."""
        front = self.front
        return (not self.pending and not self.live and (front is None or not len(front))
                and all(h.engine.idle() for h in self.hosts.values()))
