"""Agent workloads: the YAML model, the seeded plan of each program, and programs read back from
request records (E2E per class, failures ranked worst, a before/after comparison)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from tailguard.bench.agents import AgentWorkload, agent_workload, parse_agents, plan_programs
from tailguard.bench.program_stats import program_comparison, program_summary, programs_of
from tailguard.bench.recorder import RequestRecord
from tailguard.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "agents.yaml"


def test_the_example_reads_and_plans_the_same_programs_for_the_same_seed() -> None:
    w = agent_workload(EXAMPLE)
    assert w is not None and [c.name for c in w.programs] == ["short", "long"]
    first = list(itertools.islice(plan_programs(w, rate=2.0, seed=3), 200))
    again = list(itertools.islice(plan_programs(w, rate=2.0, seed=3), 200))
    other = list(itertools.islice(plan_programs(w, rate=2.0, seed=4), 200))
    assert first == again and first != other
    assert [p.index for p in first] == list(range(200)) and first[0].start_s == 0.0
    assert all(a.start_s <= b.start_s for a, b in zip(first, first[1:]))
    short = [p for p in first if p.cls == "short"]
    long = [p for p in first if p.cls == "long"]
    assert 0.7 < len(short) / 200 < 0.9  # weights 0.8 and 0.2
    assert all(1 <= len(p.steps) <= 4 for p in short) and all(12 <= len(p.steps) <= 20 for p in long)
    # The first step has no tool result before it and no gap; later ones both.
    assert all(p.steps[0].tool_tokens == 0 and p.steps[0].gap_s == 0 for p in first)
    assert all(s.tool_tokens >= 1 and 0.5 <= s.gap_s <= 3.0 for p in long for s in p.steps[1:])


def test_a_workload_is_checked_and_only_a_file_with_programs_is_one() -> None:
    w = parse_agents({"name": "x", "programs": [{"name": "a", "steps": 3, "parallel": 2, "tool_gap_s": 0.25}]})
    [plan] = itertools.islice(plan_programs(w, rate=1.0), 1)
    assert [len(s.max_tokens) for s in plan.steps] == [2, 2, 2] and plan.calls == 6 and plan.steps[1].gap_s == 0.25
    with pytest.raises(ConfigError, match="unique"):
        parse_agents({"name": "x", "programs": [{"name": "a"}, {"name": "a"}]})
    with pytest.raises(ConfigError, match="tool_gap_s"):
        parse_agents({"name": "x", "programs": [{"name": "a", "tool_gap_s": {"dist": "uniform", "low": 2, "high": 1}}]})
    assert agent_workload("seed-mixed") is None and agent_workload(w) is w
    assert isinstance(w, AgentWorkload) and [c.name for c in w.as_workload().classes] == ["a"]


def call(program: int, n: int, cls: str, at: float, end: float, ok: bool = True, last: bool = False) -> RequestRecord:
    return RequestRecord(index=program * 100 + n, cls=cls, warmup=False, scheduled_at=at, ended_at=end, ok=ok,
                         error_kind=None if ok else "http", program=program, program_call=n, program_last=last)


def test_programs_are_read_back_from_their_calls() -> None:
    records = [
        call(0, 1, "short", 0.0, 2.0), call(0, 2, "short", 3.0, 5.0, last=True),  # 5 s
        call(1, 1, "long", 1.0, 4.0), call(1, 2, "long", 5.0, 21.0, last=True),  # 20 s
        call(2, 1, "short", 2.0, 3.0, ok=False),  # failed at its first call
        call(3, 1, "short", 4.0, 6.0, last=True),  # 2 s
        RequestRecord(index=999, cls="short", warmup=False, scheduled_at=0.0, ended_at=1.0, ok=True),  # no program
    ]
    progs = programs_of(records)
    assert [(p.index, p.calls, p.ok) for p in progs] == [(0, 2, True), (1, 2, True), (2, 1, False), (3, 1, True)]
    assert [p.e2e_s for p in progs] == [5.0, 20.0, math.inf, 2.0]
    s = program_summary(records)
    assert s is not None
    assert s["classes"]["short"]["count"] == 3 and s["classes"]["short"]["failed"] == 1
    assert s["classes"]["short"]["e2e_s"]["max"] is None  # a failed program ranks as worst: no finite max
    assert s["classes"]["long"]["e2e_s"]["p50"] == 20.0 and s["overall"]["calls_mean"] == 1.5
    assert program_summary(records[-1:]) is None
    faster = [call(0, 1, "short", 0.0, 1.0), call(0, 2, "short", 1.5, 2.5, last=True),
              call(1, 1, "long", 1.0, 11.0, last=True)]
    cmp = program_comparison(records, faster)
    assert cmp is not None and cmp["long"]["ratio"]["p50"] == 0.5 and cmp["short"]["after"]["failed"] == 0
