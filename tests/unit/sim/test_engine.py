import random

import pytest

from tailguard.sim.cost import CostModel, EngineConfig
from tailguard.sim.engine import (
    Admitted, Engine, FirstToken, Preempted, RequestFinished, SimRequest, Step,
)
from tailguard.sim.kv import prefix_block_hashes
from tests.unit.sim.reference import RefEngine

COST = CostModel(a_s=0.01, b_s_per_prefill_token=0.001, c_s_per_decode_seq=0.0001, d_s_per_kv_token=1e-6)


def config(**kw: object) -> EngineConfig:
    base: dict[str, object] = dict(cost=COST, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024,
                                   kv_cache_tokens=4096)
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def drive(engine: Engine, arrivals: list[tuple[float, SimRequest]] = (), t: float = 0.0,  # type: ignore[assignment]
          check: bool = True) -> list[Step]:
    """Step until idle, adding each request once the clock reaches its arrival; audits every step."""
    pending = sorted(arrivals, key=lambda x: x[0])
    steps: list[Step] = []
    while pending or not engine.idle():
        while pending and (engine.idle() or pending[0][0] <= t):
            at, req = pending.pop(0)
            t = max(t, at)
            engine.add(req, t)
        step = engine.step(t)
        steps.append(step)
        if check:
            assert engine.audit() == []
            assert engine.num_running <= engine.config.max_num_seqs
            assert engine.kv.used_blocks <= engine.kv.num_blocks
        t = step.ended_at
    return steps


def events_of(steps: list[Step], kind: type) -> list:  # type: ignore[type-arg]
    return [(s, ev) for s in steps for ev in s.events if isinstance(ev, kind)]


def test_single_request_times_follow_the_cost_model_exactly() -> None:
    e = Engine(config())
    e.add(SimRequest("r", prompt_tokens=100, max_tokens=3), now=0.0)
    steps = drive(e)
    assert [s.prefill_tokens for s in steps] == [100, 0, 0]
    assert steps[0].duration_s == pytest.approx(0.01 + 100 * 0.001)  # prefill emits the first token
    # decode steps read the prompt plus the output so far
    assert steps[1].duration_s == pytest.approx(0.01 + 0.0001 + 101e-6)
    assert steps[2].duration_s == pytest.approx(0.01 + 0.0001 + 102e-6)
    assert [s.emitted for s in steps] == [("r",), ("r",), ("r",)]
    assert isinstance(steps[0].events[0], Admitted) and isinstance(steps[0].events[1], FirstToken)
    assert steps[2].events == (RequestFinished("r", 100, 3, "length", 0),)
    assert e.idle() and e.kv.used_blocks == 0
    assert e.prompt_tokens_total == 100 and e.generation_tokens_total == 3


def test_exact_max_tokens_for_every_request_and_nothing_before_prefill_completes() -> None:
    rng = random.Random(7)
    e = Engine(config(max_num_batched_tokens=64))
    reqs = [(rng.uniform(0, 2), SimRequest(f"r{i}", rng.randint(1, 600), rng.randint(1, 40))) for i in range(60)]
    steps = drive(e, reqs)
    counts: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    first_event: dict[str, int] = {}
    for n, s in enumerate(steps):
        for rid in s.emitted:
            counts[rid] = counts.get(rid, 0) + 1
            first_seen.setdefault(rid, n)
        for ev in s.events:
            if isinstance(ev, FirstToken):
                first_event[ev.req_id] = n
    want = {r.id: r.max_tokens for _, r in reqs}
    assert counts == want
    assert first_seen == first_event
    finished = {ev.req_id: ev.output_tokens for _, ev in events_of(steps, RequestFinished)}
    assert finished == want
    assert all(s.prefill_tokens <= 64 for s in steps)  # chunked prefill stays within the budget


def test_never_more_than_max_num_seqs_running_and_the_rest_wait() -> None:
    e = Engine(config(max_num_seqs=2))
    for i in range(5):
        e.add(SimRequest(f"r{i}", 10, 20), now=0.0)
    e.step(0.0)
    assert e.num_running == 2 and e.num_waiting == 3
    drive(e)
    assert e.idle() and e.num_waiting == 0


def test_fcfs_keeps_arrival_order_of_first_tokens_and_ignores_priority() -> None:
    e = Engine(config(max_num_seqs=1))
    reqs = [(0.001 * i, SimRequest(f"r{i}", 30, 5, priority=-i)) for i in range(6)]
    steps = drive(e, reqs)
    assert [ev.req_id for _, ev in events_of(steps, FirstToken)] == [f"r{i}" for i in range(6)]


def test_priority_policy_admits_lowest_priority_value_first_then_arrival() -> None:
    e = Engine(config(max_num_seqs=1, scheduling_policy="priority"))
    e.add(SimRequest("busy", 10, 5), now=0.0)
    e.step(0.0)
    for rid, prio in [("low-a", 5), ("high", -1), ("mid", 0), ("low-b", 5), ("high-2", -1)]:
        e.add(SimRequest(rid, 10, 2, priority=prio), now=0.001)
    steps = drive(e, t=0.1)
    order = [ev.req_id for _, ev in events_of(steps, FirstToken)]
    assert order == ["high", "high-2", "mid", "low-a", "low-b"]


def test_kv_exhaustion_preempts_the_newest_and_recomputes_it_later() -> None:
    # 12 blocks of 16 tokens: two requests of 64-token prompts growing to 64+40 tokens need 7 blocks
    # each, 14 in all, so the second admitted must be preempted and recomputed.
    e = Engine(config(kv_cache_tokens=192, max_model_len=192, max_num_batched_tokens=256))
    e.add(SimRequest("old", 64, 40), now=0.0)
    e.add(SimRequest("new", 64, 40), now=0.0)
    steps = drive(e)
    pre = events_of(steps, Preempted)
    assert pre and all(ev.req_id == "new" for _, ev in pre)
    step_of_pre, ev = pre[0]
    assert ev.output_tokens > 0
    # After preemption, "new" is admitted again and prefills prompt + the output it already has.
    resumed = [(s, a) for s, a in events_of(steps, Admitted) if a.req_id == "new" and a.resumed]
    assert resumed
    s, _ = resumed[0]
    assert s.prefill_tokens >= 64 + ev.output_tokens
    fin = {x.req_id: x for _, x in events_of(steps, RequestFinished)}
    assert fin["old"].output_tokens == 40 and fin["old"].preemptions == 0
    assert fin["new"].output_tokens == 40 and fin["new"].preemptions >= 1
    counts: dict[str, int] = {}
    for st in steps:
        for rid in st.emitted:
            counts[rid] = counts.get(rid, 0) + 1
    assert counts == {"old": 40, "new": 40}  # recompute emits no duplicate tokens
    assert e.preemptions_total == len(pre)


def test_priority_policy_preempts_the_least_important_running_request() -> None:
    e = Engine(config(kv_cache_tokens=192, max_model_len=192, scheduling_policy="priority"))
    e.add(SimRequest("vip", 64, 40, priority=0), now=0.0)
    e.add(SimRequest("bulk", 64, 40, priority=9), now=0.0)
    steps = drive(e)
    assert {ev.req_id for _, ev in events_of(steps, Preempted)} == {"bulk"}


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_a_naive_reference_step_for_step(policy: str, seed: int) -> None:
    cfg = config(max_num_seqs=6, max_num_batched_tokens=96, kv_cache_tokens=1024, max_model_len=1024,
                 scheduling_policy=policy)
    e, ref = Engine(cfg), RefEngine(cfg)
    rng = random.Random(seed)
    pending = sorted(
        ((rng.uniform(0, 3), SimRequest(f"r{i}", rng.choice([5, 16, 33, 120, 400]), rng.choice([1, 2, 17, 90]),
                                        priority=rng.randint(0, 3))) for i in range(80)),
        key=lambda x: x[0],
    )
    t = 0.0
    preemptions = 0
    while pending or not e.idle():
        while pending and (e.idle() or pending[0][0] <= t):
            at, req = pending.pop(0)
            t = max(t, at)
            e.add(req, t)
            ref.add(req, t)
        if rng.random() < 0.02 and e.num_running:
            victim = rng.choice(sorted(getattr(e, "_running")))
            assert e.abort(victim, t)
            ref.abort(victim, t)
        a, b = e.step(t), ref.step(t)
        assert a.events == b.events
        assert sorted(a.emitted) == sorted(b.emitted)
        assert (a.prefill_tokens, a.decode_seqs, a.kv_tokens_read) == (b.prefill_tokens, b.decode_seqs, b.kv_tokens_read)
        assert a.duration_s == pytest.approx(b.duration_s)
        assert e.audit() == []
        preemptions += sum(isinstance(ev, Preempted) for ev in a.events)
        t = a.ended_at
    assert ref.idle()
    assert preemptions > 0  # the workload does exercise preemption


def test_prefix_cache_hit_skips_the_shared_prefill() -> None:
    prefix = prefix_block_hashes("system-prompt", 512)
    e = Engine(config(enable_prefix_caching=True, max_num_batched_tokens=1024))
    e.add(SimRequest("first", 520, 2, block_hashes=prefix), now=0.0)
    s1 = drive(e)
    e.add(SimRequest("second", 520, 2, block_hashes=prefix), now=10.0)
    s2 = drive(e, t=10.0)
    adm = [ev for _, ev in events_of(s2, Admitted)]
    assert adm[0].cached_tokens == 512
    assert s1[0].prefill_tokens == 520 and s2[0].prefill_tokens == 8
    assert s2[0].duration_s < s1[0].duration_s / 10
    assert e.prefix_hit_tokens_total == 512 and e.prefix_queried_tokens_total == 1040


def test_a_crash_drops_every_request_and_the_prefix_cache_but_keeps_the_counters() -> None:
    prefix = prefix_block_hashes("system-prompt", 512)
    e = Engine(config(enable_prefix_caching=True, max_num_batched_tokens=1024))
    e.add(SimRequest("done", 520, 2, block_hashes=prefix), now=0.0)
    drive(e)
    for i in range(3):
        e.add(SimRequest(f"held{i}", 520, 50, block_hashes=prefix), now=1.0)
    e.step(1.0)
    e.crash(1.1)
    assert e.idle() and e.num_running == 0 and e.kv.used_blocks == 0 and e.audit() == []
    assert e.finished_total["abort"] == 3 and e.prefix_hit_tokens_total == 3 * 512
    e.add(SimRequest("after", 520, 2, block_hashes=prefix), now=2.0)
    [adm] = [ev for _, ev in events_of(drive(e, t=2.0), Admitted)]
    assert adm.cached_tokens == 0  # restarted empty: nothing of the prefix is cached any more


def test_full_prefix_hit_still_computes_the_last_token() -> None:
    prefix = prefix_block_hashes("doc", 64)
    e = Engine(config(enable_prefix_caching=True))
    for i in range(2):
        e.add(SimRequest(f"r{i}", 64, 1, block_hashes=prefix), now=float(i))
        steps = drive(e, t=float(i))
    assert steps[0].prefill_tokens == 16  # last block recomputed: one full block short of a full hit


def test_prefix_cache_disabled_means_no_hits() -> None:
    prefix = prefix_block_hashes("system-prompt", 512)
    e = Engine(config(max_num_batched_tokens=1024))
    for i in range(2):
        e.add(SimRequest(f"r{i}", 520, 2, block_hashes=prefix), now=float(i))
        steps = drive(e, t=float(i))
        assert steps[0].prefill_tokens == 520


def test_preempted_request_finds_its_own_blocks_when_caching() -> None:
    e = Engine(config(kv_cache_tokens=192, max_model_len=192, enable_prefix_caching=True))
    e.add(SimRequest("old", 64, 40), now=0.0)
    e.add(SimRequest("new", 64, 40), now=0.0)
    steps = drive(e)
    resumed = [a for _, a in events_of(steps, Admitted) if a.resumed]
    assert resumed and resumed[0].cached_tokens > 0


def test_abort_frees_slot_and_kv_at_once() -> None:
    e = Engine(config(max_num_seqs=1))
    e.add(SimRequest("a", 200, 100), now=0.0)
    e.add(SimRequest("b", 10, 2), now=0.0)
    e.step(0.0)
    assert e.num_running == 1 and e.num_waiting == 1 and e.kv.used_blocks > 0
    assert e.abort("a", 0.5)
    assert e.num_running == 0 and e.kv.used_blocks == 0
    assert not e.abort("a", 0.5)
    step = e.step(0.5)
    assert [ev.req_id for ev in step.events if isinstance(ev, Admitted)] == ["b"]
    assert e.abort("b", 0.6)
    assert e.idle()
    assert e.finished_total["abort"] == 2


def run_then_abort(e: Engine, req: SimRequest, tokens: int) -> float:
    """Step `req` alone until it has generated `tokens`, abort it; returns the time after."""
    e.add(req, now=0.0)
    t = 0.0
    while e.output_tokens(req.id) < tokens:
        t = e.step(t).ended_at
    assert e.abort(req.id, t)
    return t


@pytest.mark.parametrize("caching,kv_key,cached", [
    (True, 7, (100 + 40 - 1) // 16 * 16),  # every full block of prompt + output, as vLLM's prefix cache
    (True, None, 0),  # nothing names the content: no other request can have computed it
    (False, 7, 0),
])
def test_a_continuation_finds_the_blocks_its_aborted_original_left(
    caching: bool, kv_key: int | None, cached: int,
) -> None:
    # The gateway suspends a request (abort) and later sends prompt + text so far as a new request.
    e = Engine(config(enable_prefix_caching=caching))
    t = run_then_abort(e, SimRequest("orig", 100, 200, kv_key=kv_key), 40)
    e.add(SimRequest("cont", 140, 160, kv_key=kv_key), now=t)
    steps = drive(e, t=t)
    (adm,) = [a for _, a in events_of(steps, Admitted)]
    assert adm.cached_tokens == cached
    assert steps[0].prefill_tokens == 140 - cached


def test_kv_key_is_bounded() -> None:
    with pytest.raises(ValueError, match="kv_key"):
        Engine(config()).add(SimRequest("r", 10, 2, kv_key=1 << 30), now=0.0)


def test_abort_of_a_waiting_request_removes_it_from_the_queue() -> None:
    e = Engine(config(max_num_seqs=1))
    for rid in ("a", "b", "c"):
        e.add(SimRequest(rid, 10, 3), now=0.0)
    e.step(0.0)
    assert e.abort("b", 0.0) and e.num_waiting == 1
    steps = drive(e, t=0.1)
    assert [ev.req_id for _, ev in events_of(steps, FirstToken)] == ["c"]


def test_head_that_does_not_fit_blocks_the_queue_like_vllm() -> None:
    # 16 blocks; "big" holds 12, "huge" needs 15 for its first chunk: it waits although "small"
    # behind it would fit.
    e = Engine(config(kv_cache_tokens=256, max_model_len=256, max_num_batched_tokens=256))
    e.add(SimRequest("big", 190, 30), now=0.0)
    e.step(0.0)
    e.add(SimRequest("huge", 240, 1), now=0.01)
    e.add(SimRequest("small", 10, 1), now=0.01)
    step = e.step(0.5)
    assert not [ev for ev in step.events if isinstance(ev, Admitted)]
    assert e.num_waiting == 2


def test_requests_are_capped_at_max_model_len() -> None:
    e = Engine(config(max_model_len=128, kv_cache_tokens=1024))
    e.add(SimRequest("r", 100, 500), now=0.0)
    steps = drive(e)
    (_, fin), = events_of(steps, RequestFinished)
    assert fin.output_tokens == 28 and fin.finish_reason == "length"


@pytest.mark.parametrize("req,msg", [
    (SimRequest("x", 0, 5), "prompt_tokens"),
    (SimRequest("x", 5, 0), "max_tokens"),
    (SimRequest("x", 1024, 1), "max_model_len"),
])
def test_invalid_requests_are_refused(req: SimRequest, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        Engine(config()).add(req, 0.0)


def test_duplicate_ids_are_refused() -> None:
    e = Engine(config())
    e.add(SimRequest("x", 5, 5), 0.0)
    with pytest.raises(ValueError, match="already"):
        e.add(SimRequest("x", 5, 5), 0.0)


@pytest.mark.parametrize("mode", ["uniform", "exponential"])
def test_drawn_output_lengths_stay_within_max_tokens_and_stop_early(mode: str) -> None:
    e = Engine(config(output_length=mode, seed=3, max_num_seqs=64, output_mean_ratio=0.3))
    reqs = [(0.0, SimRequest(f"r{i}", 10, 100)) for i in range(200)]
    fins = [ev for _, ev in events_of(drive(e, reqs), RequestFinished)]
    lengths = [f.output_tokens for f in fins]
    assert all(1 <= n <= 100 for n in lengths)
    assert len(set(lengths)) > 20
    assert all((f.finish_reason == "length") == (f.output_tokens == 100) for f in fins)
    mean = sum(lengths) / len(lengths)
    assert (40 < mean < 62) if mode == "uniform" else (20 < mean < 42)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_random_workload_with_prefix_caching_and_aborts_keeps_the_books(policy: str) -> None:
    cfg = config(max_num_seqs=8, max_num_batched_tokens=512, kv_cache_tokens=4096, max_model_len=2048,
                 enable_prefix_caching=True, scheduling_policy=policy)
    e = Engine(cfg)
    rng = random.Random(11)
    shared = prefix_block_hashes("sys", 512)
    pending = []
    want: dict[str, int] = {}
    for i in range(250):
        p = rng.choice([20, 100, 700, 1500])
        m = min(rng.choice([1, 5, 50, 300]), 2048 - p)
        keys = shared[: p // 16] if rng.random() < 0.5 else ()
        pending.append((rng.uniform(0, 20), SimRequest(f"r{i}", p, m, rng.randint(0, 3), keys)))
        want[f"r{i}"] = m
    pending.sort(key=lambda x: x[0])
    t = 0.0
    counts: dict[str, int] = {}
    finished: dict[str, int] = {}
    aborted: set[str] = set()
    while pending or not e.idle():
        while pending and (e.idle() or pending[0][0] <= t):
            at, req = pending.pop(0)
            t = max(t, at)
            e.add(req, t)
        if rng.random() < 0.01 and not e.idle():
            rid = rng.choice(sorted(getattr(e, "_seqs")))
            assert e.abort(rid, t)
            aborted.add(rid)
        step = e.step(t)
        for rid in step.emitted:
            counts[rid] = counts.get(rid, 0) + 1
        for ev in step.events:
            if isinstance(ev, RequestFinished):
                finished[ev.req_id] = ev.output_tokens
                assert counts[ev.req_id] == ev.output_tokens == want[ev.req_id]
        assert e.audit() == []
        t = step.ended_at
    assert set(finished) | aborted == set(want) and not set(finished) & aborted
    assert e.kv.used_blocks == 0
    assert e.prefix_hit_tokens_total > 0 and e.preemptions_total > 0 and e.kv.evictions > 0
