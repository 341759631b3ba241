"""An agent workload on virtual time: each step sent when the last one's answers are all in plus
its tool time, each prompt the conversation so far (found in the engine's prefix cache), siblings
sent together, the front told each call's program, and the conversation replayed identically."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

from tailguard.bench.agents import ProgramPlan, Step, parse_agents, plan_programs
from tailguard.front.events import Arrive, Decision, Event
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, ProgramParams, QueueParams
from tailguard.recording.codec import Header, header_line, read, step_line
from tailguard.recording.replay import conform
from tailguard.sim.cost import EngineConfig
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Host
from tailguard.sweep.agents import simulate_programs
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS as OVERHEAD

WORKLOAD = parse_agents({"name": "t", "programs": [
    {"name": "agent", "system_prompt": {"tokens": 320, "shared": True}, "named_by": "header"},
    {"name": "anonymous", "named_by": "none"}]})


def hosts() -> list[Host]:
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=4, enable_prefix_caching=True)
    return [Host("e", Engine(cfg))]


def front() -> Front:
    return Front(FrontParams(classes=[ClassSpec("interactive")], backends=[BackendSpec("e", max_concurrency=4)]))


def test_each_step_follows_the_last_answers_with_the_conversation_so_far() -> None:
    plan = ProgramPlan(0, "agent", 1.0, 80, (Step(0, 0.0, (20,)), Step(200, 2.0, (30, 30)), Step(100, 1.0, (10,))))
    told: list[Arrive] = []

    def tap(event: object, now: float, preempt: bool, decisions: object) -> None:
        if isinstance(event, Arrive):
            told.append(event)

    [run], timelines = simulate_programs(hosts(), front(), WORKLOAD, [plan], tap=tap)
    by = {t.id: t for t in timelines}
    assert run.ok and run.calls == 4 and [t.id for t in timelines][0] == "p0-s0-c0"
    s0, s1a, s1b, s2 = by["p0-s0-c0"], by["p0-s1-c0"], by["p0-s1-c1"], by["p0-s2-c0"]
    assert s0.prompt_tokens == 320 + 80 + 2 * OVERHEAD and s0.arrived_at == 1.0
    assert s1a.arrived_at == s1b.arrived_at == s0.finished_at + 2.0  # siblings together, after the tool's time
    assert s1a.prompt_tokens == s0.prompt_tokens + 20 + OVERHEAD + 200 + OVERHEAD  # its answer, then the tool's
    assert s2.arrived_at == max(s1a.finished_at, s1b.finished_at) + 1.0  # s1b's answer is not the conversation's
    assert s2.prompt_tokens == s1a.prompt_tokens + 30 + OVERHEAD + 100 + OVERHEAD
    assert s1a.cached_tokens >= s0.prompt_tokens // 16 * 16 - 16  # the conversation so far was in the cache
    assert run.e2e_s == s2.finished_at - 1.0
    assert {a.program for a in told} == {"program-0"}


def test_an_anonymous_program_names_none_and_shares_no_system_prompt() -> None:
    plans = [ProgramPlan(i, "anonymous", 0.0, 64, (Step(0, 0.0, (8,)),)) for i in range(2)]
    runs, timelines = simulate_programs(hosts(), None, WORKLOAD, plans)
    assert all(r.ok for r in runs) and all(t.cached_tokens == 0 for t in timelines)


def test_a_saturated_agent_run_on_two_engines_replays_decision_for_decision() -> None:
    """The DES's conversation with its front, programs and all (their levels, their homes), is a
    recording a fresh front replays identically: the DES is a full second driver of the program
    stage, as the gateway is."""
    w = parse_agents({"name": "t", "programs": [
        {"name": "short", "weight": 3, "steps": {"dist": "uniform", "low": 1, "high": 3}, "tool_tokens": 200,
         "system_prompt": {"tokens": 300}, "max_tokens": 20, "tool_gap_s": 0.2},
        {"name": "long", "steps": 8, "tool_tokens": 400, "system_prompt": {"tokens": 300}, "max_tokens": 20,
         "parallel": {"dist": "uniform", "low": 1, "high": 2}, "tool_gap_s": 0.2}]})
    params = FrontParams(classes=[ClassSpec("interactive", max_queue_wait_s=600.0)],
                         backends=[BackendSpec(n, max_concurrency=2) for n in ("a", "b")],
                         queue=QueueParams(aging_s=5.0), programs=ProgramParams(quantum_tokens=2000))
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=2, enable_prefix_caching=True)
    lines: list[str] = []

    def tape(event: Event, now: float, preempt: bool, decisions: Sequence[Decision]) -> None:
        lines.append(json.dumps(step_line(event, now, preempt, decisions)))

    plans = list(itertools.islice(plan_programs(w, rate=6.0, seed=2), 40))
    runs, timelines = simulate_programs([Host("a", Engine(cfg)), Host("b", Engine(cfg))], Front(params), w, plans,
                                        tap=tape)
    assert all(r.ok for r in runs) and max(t.front_queue_s or 0.0 for t in timelines) > 0.5  # it queued
    result = conform(read([json.dumps(header_line(Header(params))), *lines]))
    assert result.identical, str(result)
