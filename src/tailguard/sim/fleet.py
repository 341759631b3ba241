"""What happens to the hosts of a discrete-event run (`sim.des`) whatever their requests do: a
host dies (its requests fail) and revives, the gateway's probes find it up, down or hung, a
request at a hung host meets its header deadline, and the autoscaler adds engines that join the
front as a reload adds a backend; pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tailguard.clock import VirtualClock
from tailguard.front.events import Loaded, Probed, Reconfigure
from tailguard.front.front import Front
from tailguard.sim.agenda import DEATH, PROBE, PROBE_TIMEOUT, REVIVAL, SCALE
from tailguard.sim.carrier import Carrier
from tailguard.sim.live import Autoscaler, LiveHost
from tailguard.sim.scenario import Arrival, Host, Probing, Scaled, Timeline
from tailguard.types import FailureKind

# How a request at a hung host fails: no response head by the gateway's deadline (its
# `timeouts.header_s`), which the front reads as a hung server.
HUNG = FailureKind.TIMEOUT_HEADER


class Fleet(Carrier):
    """A run's hosts as things happen to them; `sim.des.Driver` adds the loop that advances the clock."""

    def __init__(
        self, hosts: Sequence[Host], clock: VirtualClock, front: Front | None,
        by_id: dict[str, Timeline], pending: list[tuple[float, int, Arrival]], record: bool, header_timeout_s: float,
        probes: Probing | None,
    ) -> None:
        super().__init__(hosts, clock, front, by_id, pending, record, header_timeout_s)
        self.probes = probes
        self.alive = len(hosts)  # hosts not dead: while all of them are stepping, none can begin a step
        for h in hosts:
            host = self.hosts[h.name]
            if h.revives_at is not None and (h.dies_at is None or h.revives_at <= h.dies_at):
                raise ValueError(f"host {h.name!r} revives at {h.revives_at}: only after it dies ({h.dies_at})")
            if h.dies_at is not None:
                self.agenda.schedule(h.dies_at, DEATH, host)
            if h.revives_at is not None:
                self.agenda.schedule(h.revives_at, REVIVAL, host)
            if probes is not None:
                self.agenda.schedule(clock.now(), PROBE, host)

    def _host_due(self, order: int, h: LiveHost, t: float) -> None:
        """What happens to `h` whatever its requests do: it dies, revives, or is probed."""
        if order == DEATH:
            self._die(h)
        elif order == REVIVAL:
            h.dead = False
            self.alive += 1
        elif order == PROBE_TIMEOUT:
            self._probed(h, False, t)
        else:
            probes = self.probes
            assert probes is not None
            self.agenda.schedule(t + probes.interval_s, PROBE, h)
            if h.faults.hangs(False, t) and not h.dead:
                self.agenda.schedule(t + probes.timeout_s, PROBE_TIMEOUT, h)
            else:
                self._probed(h, not h.dead, t)

    def _probed(self, h: LiveHost, ok: bool, t: float) -> None:
        """A probe's answer, with the engine's own count of what it runs and queues (its load
        page, read with the probe) when it answered."""
        front = self.front
        assert front is not None
        self._apply(self.tell(Probed(h.name, ok), t, preempt=not self.stepping))
        if ok:
            e = h.engine
            self._apply(self.tell(Loaded(h.name, e.num_running + e.num_waiting), t, preempt=not self.stepping))

    def _die(self, h: LiveHost) -> None:
        """`h`'s process died: its step in flight is lost, and what it held fails; a request
        that had its response head (every request an engine took: it answers a stream at once)
        fails as a stream cut short, one at a hung host as a broken connection."""
        t = self.clock.now()
        held = [(rid, lv) for rid, lv in self.live.items() if lv.host is h or lv.hedge is h]
        produced = {rid: h.produced(rid) for rid, _ in held}
        produced_in_engine = {rid for rid, _ in held if h.engine.has(rid)}
        h.dead = True
        self.alive -= 1
        if h.step is not None:
            h.step = None
            self.stepping -= 1
        h.cut.clear()
        h.engine.crash(t)
        for rid, lv in held:
            if lv.host is h or lv.hedge is h:  # not moved by what an earlier failure led to
                # a request with no engine run there was hung: no response head, its connection reset
                hung = rid not in produced_in_engine
                kind = FailureKind.RESET if hung else FailureKind.DISCONNECT
                self._fail(rid, lv, h, kind, not hung, produced[rid], t)

    def _header_deadline(self, rid: str, attempt: int) -> None:
        lv = self.live.get(rid)
        if lv is None:
            return
        for h, n in ((lv.host, lv.attempt), (lv.hedge, lv.hedge_attempt)):
            if h is not None and n == attempt and not h.engine.has(rid):  # still no answer
                self._fail(rid, lv, h, HUNG, False, 0, self.clock.now())

    # --- scaling -------------------------------------------------------------------------------

    def _scale(self, what: Autoscaler | Host, t: float) -> None:
        """The autoscaler reads the signal (and comes back in `interval_s` while work is left),
        or an engine it asked for is up: it joins the front as a reload adds a backend."""
        sc, front = self.scaler, self.front
        assert sc is not None and front is not None
        if isinstance(what, Host):
            sc.coming -= 1
            self._join(what, t)
            return
        if self._all_done():
            return
        self.agenda.schedule(t + sc.scaling.interval_s, SCALE, sc)
        pool = front.params.backends[0].pool
        reading = sc.capacity.measure(front, t).get(pool)
        if reading is None:
            return
        for _ in range(min(reading.needed - reading.ready - sc.coming, sc.scaling.max_hosts - sc.hosts)):
            host = sc.scaling.make(f"scaled{sc.hosts}")
            sc.hosts += 1
            sc.coming += 1
            ready_at = t + sc.scaling.provision_s
            sc.scaling.added.append(Scaled(host.name, t, reading.needed, ready_at))
            self.agenda.schedule(ready_at, SCALE, host)

    def _join(self, host: Host, t: float) -> None:
        front = self.front
        assert front is not None
        if host.name in self.hosts:
            raise ValueError(f"scaling made a host named {host.name!r} twice")
        h = self.hosts[host.name] = LiveHost(host)
        self.alive += 1
        self.max_model_len = max(self.max_model_len, host.engine.config.max_model_len)
        params = front.params
        spec = replace(params.backends[0], name=host.name)
        self._apply(self.tell(Reconfigure(replace(params, backends=[*params.backends, spec])), t,
                              preempt=not self.stepping))
        if self.probes is not None:
            self.agenda.schedule(t, PROBE, h)

