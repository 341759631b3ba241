"""An agent workload on virtual time: the programs of `bench.agents` played through the
discrete-event simulator, each step's calls sent as the previous step's last answer came plus
its tool time, behind a front or straight to the engines; pure, no I/O.

Each call's prompt is the program's conversation so far: the system prompt, the task, and for
every earlier step the first sibling's answer (its real output length) and the tool result. The
engines' prefix cache sees it as the HTTP run's would: the system prompt's blocks are keyed
alike for every program of the workload (when `shared`), the rest by the program and the block's
place, so a call finds cached what its program's earlier calls sent (the earlier answers' blocks
excepted: the engine keeps a request's output private, a small under-count against a real
engine, which caches generated blocks too).

    plans = list(itertools.islice(plan_programs(workload, rate=2.0, seed=1), 600))
    runs, timelines = simulate_programs(hosts, front, workload, plans)
    [r.e2e_s for r in runs if r.ok]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tailguard.bench.agents import AgentWorkload, ProgramPlan
from tailguard.clock import VirtualClock
from tailguard.front.front import Front
from tailguard.sim.des import run_fleet
from tailguard.sim.scenario import Arrival, Host, Tap, Timeline
from tailguard.types import Outcome
from tailguard.wire.headers import CLASS_HEADER
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS

_SHARED = 1 << 62  # keys of a shared system prompt's blocks
_OWN = 1 << 61  # keys of a program's own blocks: (program, place)


@dataclass(slots=True)
class ProgramRun:
    """What became of one program: when it was due, when its last answer came (None: it did
    not end well), its calls and how many of them failed."""

    index: int
    cls: str
    start_s: float
    calls: int = 0
    failed: int = 0
    end_s: float | None = None
    call_ids: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.end_s is not None and not self.failed

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s


class _Program:
    """A program while the run goes: its plan, its conversation's size so far, its step."""

    __slots__ = ("plan", "run", "step", "tokens", "waiting", "first_output", "system", "shared", "program_id", "cls")

    def __init__(self, plan: ProgramPlan, system: int, shared: int | None, named: bool, cls: str) -> None:
        self.plan = plan
        self.shared = shared  # the base of its system prompt's keys when every program shares it
        self.run = ProgramRun(plan.index, plan.cls, plan.start_s)
        self.step = 0
        self.system = system
        # system prompt (its own message) and the task (the user's), with each message's overhead
        overhead = CHAT_MESSAGE_OVERHEAD_TOKENS * (2 if system else 1)
        self.tokens = system + plan.task_tokens + overhead
        self.waiting = 0  # calls of this step not ended
        self.first_output = 0  # the first sibling's answer: what the conversation goes on from
        self.program_id = f"program-{plan.index}" if named else None
        self.cls = cls


def simulate_programs(hosts: Sequence[Host], front: Front | None, workload: AgentWorkload,
                      plans: Sequence[ProgramPlan], clock: VirtualClock | None = None, tap: Tap | None = None,
                      ) -> tuple[list[ProgramRun], list[Timeline]]:
    """Play `plans` through the fleet (behind `front`, else straight to the one host); every
    program runs to its end or its first failed call. `tap` hears the front's conversation
    (`sim.des.run_fleet`)."""
    classes = {c.name: c for c in workload.programs}
    block = hosts[0].engine.config.block_size
    programs: dict[str, _Program] = {}  # call id -> its program

    def calls(p: _Program, at: float) -> list[Arrival]:
        step = p.plan.steps[p.step]
        if p.step:  # the tool result of the last step, as a message of its own
            p.tokens += step.tool_tokens + CHAT_MESSAGE_OVERHEAD_TOKENS
        keys = _keys(p, block)
        out = []
        for i, max_tokens in enumerate(step.max_tokens):
            rid = f"p{p.plan.index}-s{p.step}-c{i}"
            programs[rid] = p
            p.run.call_ids.append(rid)
            out.append(Arrival(rid, at, p.tokens, max_tokens, cls=p.cls, block_hashes=keys, program=p.program_id))
        p.waiting = len(out)
        p.run.calls += len(out)
        return out

    def follow_up(tl: Timeline, now: float) -> list[Arrival]:
        p = programs.pop(tl.id)
        if tl.outcome is not Outcome.SUCCESS:
            p.run.failed += 1
        elif tl.id.endswith("-c0"):
            p.first_output = tl.output_tokens
        p.waiting -= 1
        if p.waiting or p.run.failed:
            return []
        p.tokens += p.first_output + CHAT_MESSAGE_OVERHEAD_TOKENS  # the answer, as the assistant's message
        p.step += 1
        if p.step == len(p.plan.steps):
            p.run.end_s = now
            return []
        return calls(p, now + p.plan.steps[p.step].gap_s)

    first: list[Arrival] = []
    runs: list[ProgramRun] = []
    for plan in plans:
        c = classes[plan.cls]
        sp = c.system_prompt
        shared = _SHARED | (list(classes).index(plan.cls) << 24) if sp is not None and sp.shared else None
        p = _Program(plan, sp.tokens if sp is not None else 0, shared, c.named_by != "none",
                     c.headers.get(CLASS_HEADER, "interactive"))
        runs.append(p.run)
        first += calls(p, plan.start_s)
    first.sort(key=lambda a: a.at)
    timelines = run_fleet(hosts, first, clock or VirtualClock(), front, follow_up=follow_up, tap=tap)
    return runs, timelines


def _keys(p: _Program, block: int) -> tuple[int, ...]:
    """The prefix-cache keys of the program's conversation so far: its shared system prompt's
    full blocks keyed alike for every program, the rest by (program, place)."""
    n = p.tokens // block
    base = p.shared
    shared = () if base is None else tuple(base | i for i in range(min(n, p.system // block)))
    own = _OWN | p.plan.index << 24
    return (*shared, *(own | i for i in range(len(shared), n)))
