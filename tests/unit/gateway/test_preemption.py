"""The preemption policy, the continuation body and the scheduler/pool hooks they use, on
literal numbers."""

from __future__ import annotations

from tailguard.gateway.backends import BackendPool
from tailguard.gateway.config import BackendConfig, ClassConfig, SchedulerConfig
from tailguard.gateway.preemption import Candidate, PreemptionPolicy
from tailguard.gateway.resume import Progress, continuation_body, resumable
from tailguard.gateway.scheduler import Pending, RankedSjfScheduler

CHAT = Pending("chat", "interactive", 0, 40, arrived_at=10.0, wait_bound_at=40.0)


def cand(id: str, remaining: int, *, rank: int = 1, preemptions: int = 0, since: float = 0.0) -> Candidate:
    return Candidate(id, "batch" if rank else "interactive", rank, "b0", remaining, preemptions, since)


def test_the_victim_is_the_lower_priority_request_with_most_work_left() -> None:
    p = PreemptionPolicy(max_preemptions=3, min_run_s=0.0)
    running = [cand("a", 500), cand("b", 1900), cand("c", 1200), cand("i", 5000, rank=0)]
    assert p.victim(CHAT, running, 10.0, lambda c: True) == running[1]


def test_never_a_request_of_the_same_or_higher_priority() -> None:
    p = PreemptionPolicy()
    assert p.victim(CHAT, [cand("i", 5000, rank=0)], 10.0, lambda c: True) is None
    batch_head = Pending("b9", "batch", 1, 2080, 10.0, 600.0)
    assert p.victim(batch_head, [cand("a", 1900)], 10.0, lambda c: True) is None


def test_limits_preemption_count_minimum_run_and_fit() -> None:
    p = PreemptionPolicy(max_preemptions=2, min_run_s=1.0)
    tired = cand("a", 1900, preemptions=2)
    fresh = cand("b", 1800, since=9.5)  # started 0.5 s ago
    done = cand("c", 0)
    elsewhere = cand("d", 1700)
    ok = cand("e", 100)
    running = [tired, fresh, done, elsewhere, ok]
    assert p.victim(CHAT, running, 10.0, lambda c: c.id != "d") == ok
    assert p.victim(CHAT, running[:4], 10.0, lambda c: c.id != "d") is None


def test_ties_go_to_the_most_recently_started() -> None:
    p = PreemptionPolicy(min_run_s=0.0)
    assert p.victim(CHAT, [cand("a", 1000, since=1.0), cand("b", 1000, since=3.0)], 10.0, lambda c: True).id == "b"  # type: ignore[union-attr]


def test_from_config_off_for_fcfs_and_when_disabled() -> None:
    assert PreemptionPolicy.from_config(SchedulerConfig()) == PreemptionPolicy(16, 0.0)
    assert PreemptionPolicy.from_config(SchedulerConfig(policy="fcfs")) is None
    assert PreemptionPolicy.from_config(SchedulerConfig(preemption=False)) is None


def test_chat_continuation_appends_the_text_and_shrinks_the_budget() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100,
            "max_completion_tokens": 90, "min_tokens": 5}
    prog = Progress(parts=["Once", " upon", " a"], tokens=3)
    out = continuation_body(body, "chat", prog)
    assert out["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon a"}]
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert (out["max_tokens"], out["max_completion_tokens"], out["min_tokens"]) == (97, 87, 2)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 100  # untouched
    assert (prog.runs, prog.base_tokens, prog.added_prompt_tokens) == (2, 3, 4 + 3)  # 11 bytes -> 3 tokens
    # The client sees its own prompt and every token: upstream counted 7 more prompt tokens.
    assert prog.client_usage(19, 97) == (12, 100)


def test_completion_continuation_and_a_client_continuing_its_own_message() -> None:
    prog = Progress(parts=["abcd"], tokens=1)
    out = continuation_body({"prompt": "x" * 8, "max_tokens": 10}, "completions", prog)
    assert (out["prompt"], out["max_tokens"], prog.added_prompt_tokens) == ("x" * 8 + "abcd", 9, 1)
    own = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The"}],
           "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 4}
    assert resumable(own, "chat")
    out = continuation_body(own, "chat", Progress(parts=[" end"], tokens=1))
    assert out["messages"][-1] == {"role": "assistant", "content": "The end"} and out["max_tokens"] == 3


def test_nothing_generated_yet_restarts_the_same_body() -> None:
    body = {"prompt": "p", "max_tokens": 10}
    prog = Progress()
    assert continuation_body(body, "completions", prog) is body
    assert prog.runs == 2 and prog.client_usage(1, 10) == (1, 10)


def test_only_plain_text_generations_are_resumable() -> None:
    msgs = [{"role": "user", "content": "q"}]
    assert resumable({"messages": msgs}, "chat")
    assert not resumable({"messages": msgs, "tools": [{"type": "function"}]}, "chat")
    assert not resumable({"messages": msgs, "n": 2}, "chat")
    assert not resumable({"messages": msgs, "response_format": {"type": "json_object"}}, "chat")
    assert not resumable({"prompt": [1, 2, 3]}, "completions")
    assert not resumable({"prompt": "p", "echo": True}, "completions")


def test_pool_fit_after_release_respects_shares() -> None:
    classes = [ClassConfig(name="interactive", rank=0), ClassConfig(name="batch", rank=1, max_share=0.5)]
    pool = BackendPool([BackendConfig(name="b0", url="http://127.0.0.1:1", max_concurrency=2)], classes)
    pool.acquire("b0", "batch")
    pool.acquire("b0", "interactive")
    assert pool.fits_after_release("b0", "interactive", "batch")
    assert pool.fits_after_release("b0", "batch", "batch")  # batch may hold 1 of 2
    assert not pool.fits_after_release("b0", "batch", "interactive")  # batch would still hold its 1


def test_scheduler_head_take_requeue_keep_arrival_and_guarantees() -> None:
    classes = [ClassConfig(name="interactive", rank=0), ClassConfig(name="batch", rank=1, min_share=0.5)]
    s = RankedSjfScheduler(SchedulerConfig(), classes)
    s.push(Pending("b1", "batch", 1, 2080, 0.0, 600.0), 0.0)
    assert s.pop(0.0) is not None and s.running("batch") == 1
    assert not s.guaranteed("batch")  # floor(0.5 * 1) = 0 slots guaranteed
    s.push(Pending("c0", "interactive", 0, 40, 1.0, 31.0), 1.0)
    assert s.pop(1.0) is not None
    assert s.guaranteed("batch")  # 1 of 2 running, floor(0.5 * 2) = 1: suspending it breaks the floor
    s.push(CHAT, 10.0)
    assert s.head(10.0) == CHAT and len(s) == 1  # head leaves it queued
    s.requeue(Pending("b1", "batch", 1, 2080, 0.0, 610.0), 10.0)
    assert s.running("batch") == 0 and s.queue_len("batch") == 1
    assert s.take("chat", 10.0) == CHAT and s.running("interactive") == 2
    back = s.pop(10.5)
    assert back is not None and back.id == "b1" and back.arrived_at == 0.0
