import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from tailguard.clock import VirtualClock
from tailguard.front.events import Arrive, Decision, Event
from tailguard.front.front import Front
from tailguard.front.intake import Accepted
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, PreemptionParams, QueueParams
from tailguard.sim.cost import CostModel, EngineConfig
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival, Timeline
from tailguard.sim.engine import Engine
from tailguard.sim.kv import prefix_block_hashes
from tailguard.types import Outcome

COST = CostModel(a_s=0.01, b_s_per_prefill_token=0.001, c_s_per_decode_seq=0.0001, d_s_per_kv_token=1e-6)


def engine(**kw: object) -> Engine:
    base: dict[str, object] = dict(cost=COST, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024,
                                   kv_cache_tokens=4096)
    base.update(kw)
    return Engine(EngineConfig(**base))  # type: ignore[arg-type]


def classes() -> list[ClassSpec]:
    return [ClassSpec(name="interactive", rank=0, max_queue_len=100),
            ClassSpec(name="hurry", rank=0, max_queue_wait_s=0.5),
            ClassSpec(name="batch", rank=1, max_queue_len=3)]


def front(policy: str, limit: int, cls: list[ClassSpec] | None = None, max_preemptions: int = 0) -> Front:
    """The gateway's front with one backend, the engine, holding `limit` requests at once."""
    return Front(FrontParams(
        classes=cls or classes(), backends=[BackendSpec("engine", max_concurrency=limit, continues=True)],
        queue=QueueParams(policy=policy),
        preemption=PreemptionParams(enabled=max_preemptions > 0, max_preemptions_per_request=max_preemptions),
    ))


def test_single_request_ttft_is_the_analytic_prefill_step() -> None:
    [tl] = run(engine(), [Arrival("r", at=2.0, prompt_tokens=100, max_tokens=3)], VirtualClock(), record_tokens=True)
    prefill = 0.01 + 100 * 0.001
    d1 = 0.01 + 0.0001 + 101e-6
    d2 = 0.01 + 0.0001 + 102e-6
    assert tl.outcome is Outcome.SUCCESS and tl.finish_reason == "length"
    assert tl.queue_s == 0.0 and tl.front_queue_s == 0.0
    assert tl.ttft_s == pytest.approx(prefill)
    assert tl.token_times == pytest.approx([2 + prefill, 2 + prefill + d1, 2 + prefill + d1 + d2])
    assert tl.e2e_s == pytest.approx(prefill + d1 + d2)
    assert tl.tpot_s == pytest.approx((d1 + d2) / 2)
    assert tl.output_tokens == 3


def test_arrival_during_a_step_waits_for_the_next_one() -> None:
    tls = run(engine(), [Arrival("a", 0.0, 100, 1), Arrival("b", 0.05, 10, 1)], VirtualClock())
    a, b = tls
    assert a.finished_at == pytest.approx(0.11)
    assert b.admitted_at == pytest.approx(0.11) and b.queue_s == pytest.approx(0.06)
    assert b.ttft_s == pytest.approx(0.06 + 0.01 + 0.01)


def test_queue_wait_appears_when_slots_are_full() -> None:
    arrivals = [Arrival(f"r{i}", 0.0, 10, 50) for i in range(6)]
    tls = run(engine(max_num_seqs=2), arrivals, VirtualClock())
    waits = [tl.queue_s for tl in tls]
    assert waits[:2] == [0.0, 0.0]
    assert all(w is not None and w > 0 for w in waits[2:])
    assert all(tl.output_tokens == 50 for tl in tls)


def test_same_input_same_timelines() -> None:
    arrivals = [Arrival(f"r{i}", i * 0.013, 10 + (i * 37) % 500, 1 + (i * 11) % 60, priority=i % 3) for i in range(300)]
    a = run(engine(kv_cache_tokens=1024, max_model_len=1024), arrivals, VirtualClock())
    b = run(engine(kv_cache_tokens=1024, max_model_len=1024), arrivals, VirtualClock())
    assert a == b
    assert any(tl.preemptions for tl in a)
    assert [tl.id for tl in a] == [x.id for x in arrivals]


def test_timelines_come_back_in_the_given_order_even_if_unsorted() -> None:
    arrivals = [Arrival("late", 1.0, 10, 2), Arrival("early", 0.0, 10, 2)]
    tls = run(engine(), arrivals, VirtualClock())
    assert [t.id for t in tls] == ["late", "early"]
    assert tls[1].finished_at is not None and tls[1].finished_at < tls[0].finished_at  # type: ignore[operator]


def test_request_beyond_max_model_len_is_a_client_error() -> None:
    [tl] = run(engine(max_model_len=256, kv_cache_tokens=1024), [Arrival("r", 0.0, 200, 100)], VirtualClock())
    assert tl.outcome is Outcome.CLIENT_ERROR and tl.reject_reason == "context_length"
    assert tl.first_token_at is None


def test_record_tokens_gives_every_token_time() -> None:
    tls = run(engine(), [Arrival(f"r{i}", 0.0, 50, 20) for i in range(3)], VirtualClock(), record_tokens=True)
    for tl in tls:
        assert tl.token_times is not None and len(tl.token_times) == 20
        assert tl.token_times[0] == tl.first_token_at and tl.token_times[-1] == tl.finished_at
        assert tl.token_times == sorted(tl.token_times)


def test_prefix_hits_shorten_ttft() -> None:
    keys = prefix_block_hashes("sys", 480)
    arrivals = [Arrival(f"r{i}", float(i), 500, 2, block_hashes=keys) for i in range(3)]
    tls = run(engine(enable_prefix_caching=True, max_num_batched_tokens=1024), arrivals, VirtualClock())
    assert tls[0].cached_tokens == 0 and tls[1].cached_tokens == 480
    assert tls[1].ttft_s is not None and tls[0].ttft_s is not None and tls[1].ttft_s < tls[0].ttft_s / 5


def test_duplicate_ids_and_past_arrivals_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        run(engine(), [Arrival("a", 0.0, 1, 1), Arrival("a", 1.0, 1, 1)], VirtualClock())
    with pytest.raises(ValueError, match="before the clock"):
        run(engine(), [Arrival("a", 0.0, 1, 1)], VirtualClock(start=5.0))


def test_front_scheduler_caps_inflight_and_keeps_its_order() -> None:
    f = front("fcfs", 2)
    arrivals = [Arrival(f"r{i}", 0.001 * i, 20, 30) for i in range(8)]
    e = engine(max_num_seqs=8)
    tls = run(e, arrivals, VirtualClock(), front=f)
    assert all(tl.outcome is Outcome.SUCCESS for tl in tls)
    # Never more than two in the engine at once: each dispatch waits for an earlier finish.
    spans = sorted((tl.dispatched_at, tl.finished_at) for tl in tls)  # type: ignore[type-var]
    for t, _ in spans:
        assert sum(1 for d, f in spans if d <= t < f) <= 2  # type: ignore[operator]
    assert [tl.id for tl in sorted(tls, key=lambda x: x.dispatched_at)] == [f"r{i}" for i in range(8)]  # type: ignore[arg-type, return-value]
    assert all(tl.front_queue_s is not None for tl in tls)
    assert tls[5].front_queue_s > 0  # type: ignore[operator]
    assert len(f) == 0


def test_front_ranked_sjf_lets_chats_overtake_summaries() -> None:
    cls = classes()
    cls[2] = ClassSpec(name="batch", rank=1, max_queue_len=100)
    arrivals = [Arrival(f"s{i}", 0.0, 600, 100, cls="batch") for i in range(6)]
    arrivals += [Arrival(f"c{i}", 0.01, 20, 10, cls="interactive") for i in range(3)]

    def chats(f: Front) -> tuple[float, list[str]]:
        tls = run(engine(max_num_seqs=8, max_num_batched_tokens=1024), arrivals, VirtualClock(), front=f)
        order = [tl.id for tl in sorted(tls, key=lambda x: (x.dispatched_at, x.id))]  # type: ignore[arg-type, return-value]
        return max(tl.e2e_s for tl in tls if tl.cls == "interactive"), order  # type: ignore[type-var]

    fcfs, fcfs_order = chats(front("fcfs", 2, cls))
    sjf, sjf_order = chats(front("ranked-sjf", 2, cls))
    assert fcfs_order == [f"s{i}" for i in range(6)] + ["c0", "c1", "c2"]
    assert sjf_order == ["s0", "s1", "c0", "c1", "c2", "s2", "s3", "s4", "s5"]
    assert sjf < fcfs / 2


def test_front_rejections_and_expiry_become_timelines() -> None:
    arrivals = [Arrival("busy", 0.0, 20, 500, cls="interactive")]
    arrivals += [Arrival(f"b{i}", 0.01, 20, 5, cls="batch") for i in range(5)]
    arrivals += [Arrival("impatient", 0.02, 20, 5, cls="hurry")]
    tls = {tl.id: tl for tl in run(engine(), arrivals, VirtualClock(), front=front("fcfs", 1))}
    full = [tl for tl in tls.values() if tl.reject_reason == "queue_full"]
    assert [tl.id for tl in full] == ["b3", "b4"]
    assert all(tl.outcome is Outcome.REJECTED and tl.finished_at == pytest.approx(0.01) for tl in full)
    imp = tls["impatient"]
    assert imp.outcome is Outcome.REJECTED and imp.reject_reason == "queue_timeout"
    assert imp.finished_at == pytest.approx(0.52)
    assert imp.first_token_at is None and imp.dispatched_at is None
    assert all(tls[f"b{i}"].outcome is Outcome.SUCCESS for i in range(3))
    assert tls["busy"].outcome is Outcome.SUCCESS


def test_without_front_every_request_enters_the_engine_on_arrival() -> None:
    tls = run(engine(), [Arrival(f"r{i}", 0.5 * i, 10, 2) for i in range(4)], VirtualClock())
    assert all(tl.dispatched_at == tl.arrived_at for tl in tls)
    assert all(isinstance(tl, Timeline) and not math.isnan(tl.e2e_s or 0.0) for tl in tls)


def _preempt_case(preempt: bool) -> tuple[list[Timeline], Engine]:
    cls = [ClassSpec(name="interactive", rank=0), ClassSpec(name="batch", rank=1, preemptible=True)]
    arrivals = [Arrival("s0", 0.0, 100, 400, cls="batch"), Arrival("c0", 0.5, 20, 10)]
    e = engine(max_num_seqs=4)
    tls = run(e, arrivals, VirtualClock(), front=front("ranked-sjf", 1, cls, max_preemptions=1 if preempt else 0))
    return tls, e


def test_front_preemption_suspends_the_batch_request_and_resumes_it_to_its_full_length() -> None:
    (s_on, c_on), e_on = _preempt_case(True)
    (s_off, c_off), e_off = _preempt_case(False)
    # Off: the chat waits for the whole summary. On: it starts at once, and the summary still
    # produces all its 400 tokens, after being aborted once in the engine.
    assert c_off.dispatched_at == s_off.finished_at
    assert c_on.dispatched_at is not None and c_on.dispatched_at < 0.6
    assert c_on.finished_at < s_on.finished_at  # type: ignore[operator]
    assert (s_on.outcome, s_on.output_tokens, s_on.suspensions) == (Outcome.SUCCESS, 400, 1)
    assert (s_off.output_tokens, s_off.suspensions) == (400, 0)
    assert s_on.dispatched_at == 0.0 and s_on.first_token_at is not None and s_on.first_token_at < 0.5
    assert (e_on.finished_total["abort"], e_off.finished_total["abort"]) == (1, 0)
    # The continuation re-prefills prompt + generated text, so the summary ends a little later.
    assert s_on.finished_at > s_off.finished_at  # type: ignore[operator]


def test_follow_up_makes_a_closed_loop() -> None:
    sent: list[str] = []

    def follow_up(tl: Timeline, t: float) -> Arrival | None:
        if len(sent) >= 5:
            return None
        sent.append(f"n{len(sent)}")
        return Arrival(sent[-1], t, 20, 10)

    tls = run(engine(), [Arrival("r0", 0.0, 20, 10)], VirtualClock(), follow_up=follow_up)
    assert [tl.id for tl in tls] == ["r0", "n0", "n1", "n2", "n3", "n4"]
    for prev, nxt in zip(tls, tls[1:]):
        assert nxt.arrived_at == prev.finished_at


def test_a_refused_closed_loop_client_waits_its_retry_after_before_trying_again() -> None:
    cls = [ClassSpec(name="interactive", rank=0, max_queue_len=1)]
    sent: list[str] = []

    def follow_up(tl: Timeline, t: float) -> Arrival | None:
        if len(sent) >= 40:
            return None
        sent.append(f"n{len(sent)}")
        wait = tl.retry_after_s if tl.outcome is Outcome.REJECTED else 0.0
        assert wait is not None
        return Arrival(sent[-1], t + wait, 20, 50)

    first = [Arrival(f"c{i}", 0.0, 20, 50) for i in range(6)]
    tls = run(engine(), first, VirtualClock(), front=front("fcfs", 1, cls), follow_up=follow_up)
    refused = [tl for tl in tls if tl.outcome is Outcome.REJECTED]
    assert refused and all(tl.retry_after_s is not None and tl.retry_after_s >= 1.0 for tl in refused)
    assert len(tls) == 46 and sum(tl.outcome is Outcome.SUCCESS for tl in tls) > 6

    def impatient(tl: Timeline, t: float) -> Arrival | None:
        return Arrival(f"again-{tl.id}", t, 20, 50) if tl.outcome is Outcome.REJECTED else None

    with pytest.raises(ValueError, match="must wait"):
        run(engine(), first, VirtualClock(), front=front("fcfs", 1, cls), follow_up=impatient)


def test_callers_limits_hold_on_virtual_time() -> None:
    """The front's limits per caller, driven by the discrete-event run as by the gateway."""
    f = Front(FrontParams(classes=classes(), backends=[BackendSpec("engine", max_concurrency=4, continues=True)],
                          callers=[CallerSpec("capped", requests_per_minute=2)]))
    arrivals = [Arrival(f"c{i}", 0.1 * i, 20, 5, caller="capped") for i in range(4)]
    arrivals += [Arrival(f"f{i}", 0.1 * i, 20, 5, caller="free") for i in range(4)]
    tls = {tl.id: tl for tl in run(engine(), arrivals, VirtualClock(), front=f)}
    assert [tls[f"c{i}"].reject_reason for i in range(4)] == [None, None, "rate_limit_requests", "rate_limit_requests"]
    assert tls["c2"].retry_after_s == pytest.approx(29.8)  # one request every 30 s, and a little refilled
    assert all(tls[f"f{i}"].outcome is Outcome.SUCCESS for i in range(4))


class _Told(Front):
    """A front that keeps what arrivals it was told of."""

    def __init__(self, params: FrontParams) -> None:
        super().__init__(params)
        self.told: list[Arrive] = []

    def handle(self, event: Event, now: float, *, preempt: bool = True) -> Sequence[Decision]:
        if isinstance(event, Arrive):
            self.told.append(event)
        return super().handle(event, now, preempt=preempt)


class _Gate:
    """A gate that refuses ids starting with "bad", classes the rest as batch with a job size of
    `size`, and records what it saw."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.admitted: list[tuple[str, float]] = []
        self.ended_well: list[str] = []

    def admit(self, a: Arrival) -> Arrival:
        self.admitted.append((a.id, a.at))
        if a.id.startswith("bad"):
            return replace(a, cls="batch", refused="max_tokens_over_cap")
        accepted = Accepted(None, self.size, False, {}, resumable=False)
        return replace(a, cls="batch", max_tokens=a.max_tokens // 2, accepted=accepted)

    def finished(self, tl: Timeline) -> None:
        self.ended_well.append(tl.id)


def test_a_gate_decides_each_request_as_it_arrives_and_hears_each_success() -> None:
    f = _Told(front("ranked-sjf", 2).params)
    gate = _Gate(size=777)
    arrivals = [Arrival("ok1", 0.0, 20, 40, cls="interactive"), Arrival("bad", 0.5, 20, 40, cls="interactive"),
                Arrival("ok2", 1.0, 20, 40, cls="interactive")]
    tls = {tl.id: tl for tl in run(engine(), arrivals, VirtualClock(), front=f, gate=gate)}
    assert gate.admitted == [("ok1", 0.0), ("bad", 0.5), ("ok2", 1.0)]
    assert (tls["bad"].outcome, tls["bad"].reject_reason, tls["bad"].cls) == (
        Outcome.CLIENT_ERROR, "max_tokens_over_cap", "batch")
    assert tls["ok1"].cls == "batch" and tls["ok1"].max_tokens == tls["ok1"].output_tokens == 20
    # The front is told what the gate accepted: its size, the limit sent (none) and not resumable.
    assert [(e.id, e.cls, e.est_tokens, e.max_tokens, e.resumable) for e in f.told] == [
        ("ok1", "batch", 777, None, False), ("ok2", "batch", 777, None, False)]
    assert gate.ended_well == ["ok1", "ok2"]


def test_a_closed_loop_client_refused_at_once_keeps_going_without_recursing() -> None:
    """A client whose every request is a 400 (a class the gateway does not know) sends the next
    at once, thousands of times: the run loops through them instead of recursing."""
    sent: list[str] = []

    def follow_up(tl: Timeline, t: float) -> Arrival | None:
        if len(sent) >= 5000:
            return None
        sent.append(f"bad{len(sent)}")
        return Arrival(sent[-1], t, 20, 10)

    tls = run(engine(), [Arrival("bad", 0.0, 20, 10)], VirtualClock(), follow_up=follow_up, gate=_Gate(1))
    assert len(tls) == 5001 and all(tl.outcome is Outcome.CLIENT_ERROR for tl in tls)
    assert all(tl.arrived_at == 0.0 for tl in tls)
