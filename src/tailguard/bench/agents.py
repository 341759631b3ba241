"""Agent workloads: programs of calls, each prompt the last one plus its answer and a tool's
result, with tool time between calls; the YAML model and the seeded plan of every program. Pure:
no I/O beyond reading the workload file.

A program arrives (open loop, Poisson at the run's rate, in programs per second), draws how many
steps it makes, and runs them in order: each step sends its calls (one, or `parallel` siblings
at once, as a program that fans out sends them), waits for every answer, then its tools run for
`tool_gap_s` and their result (`tool_tokens`) is appended to the conversation before the next
step. Its user waits for the program: program E2E runs from its due start to its last answer.

    name: agents
    programs:
      - name: short
        weight: 0.8
        steps: {dist: uniform, low: 1, high: 4}
        system_prompt: {tokens: 1500, shared: true}     # tools and instructions, the same for all
        task_tokens: {dist: uniform, low: 100, high: 600}
        tool_tokens: {dist: lognormal, median: 300, sigma: 0.6, max: 4000}
        max_tokens: {dist: uniform, low: 30, high: 200}
        tool_gap_s: {dist: uniform, low: 0.5, high: 2.0}
        headers: {X-Tailguard-Class: interactive}
        named_by: header          # X-Tailguard-Program; or user, prompt_cache_key, or none (inferred)
      - name: long
        weight: 0.2
        steps: {dist: uniform, low: 12, high: 20}
        ...

Same seed, same programs: every draw comes from RNGs seeded by (seed, purpose), and the HTTP run
(`bench.programs`) and the discrete-event one (`sweep.agents`) play the same plans.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from tailguard.bench.stream import arrival_gaps
from tailguard.bench.workload import Distribution, Fixed, RequestClass, SystemPrompt, Workload, _Model, _int_is_fixed
from tailguard.errors import ConfigError

NamedBy = Literal["header", "user", "prompt_cache_key", "none"]


class FixedSeconds(_Model):
    dist: Literal["fixed"] = "fixed"
    value: float = Field(ge=0)

    def sample(self, rng: random.Random) -> float:
        return self.value


class UniformSeconds(_Model):
    dist: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> UniformSeconds:
        if self.high < self.low:
            raise ValueError(f"uniform: high ({self.high}) is below low ({self.low})")
        return self

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)


class ExponentialSeconds(_Model):
    dist: Literal["exponential"]
    mean: float = Field(gt=0)
    max: float | None = Field(default=None, gt=0)

    def sample(self, rng: random.Random) -> float:
        x = rng.expovariate(1.0 / self.mean)
        return x if self.max is None else min(x, self.max)


Seconds = Annotated[Union[FixedSeconds, UniformSeconds, ExponentialSeconds], Field(discriminator="dist")]


def _float_is_fixed(v: Any) -> Any:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return {"dist": "fixed", "value": v}
    return v


class ProgramClass(_Model):
    """One kind of program (see the module docstring)."""

    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)
    steps: Distribution = Fixed(value=1)
    parallel: Distribution = Fixed(value=1)  # calls a step sends at once (siblings)
    system_prompt: SystemPrompt | None = None
    task_tokens: Distribution = Fixed(value=200)
    tool_tokens: Distribution = Fixed(value=300)
    max_tokens: Distribution = Fixed(value=128)
    tool_gap_s: Seconds = FixedSeconds(value=1.0)
    stream: bool = True
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, Any] = Field(default_factory=dict)
    named_by: NamedBy = "header"

    @field_validator("steps", "parallel", "task_tokens", "tool_tokens", "max_tokens", mode="before")
    @classmethod
    def _fixed_shorthand(cls, v: Any) -> Any:
        return _int_is_fixed(v)

    @field_validator("tool_gap_s", mode="before")
    @classmethod
    def _fixed_seconds(cls, v: Any) -> Any:
        return _float_is_fixed(v)


class AgentWorkload(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    programs: list[ProgramClass] = Field(min_length=1)

    def as_workload(self) -> Workload:
        """Its program classes as a request workload (each call is a request of its program's
        class): what a run's description, statistics and report read."""
        return Workload(name=self.name, description=self.description, endpoint="chat", classes=[
            RequestClass(name=c.name, weight=c.weight, max_tokens=c.max_tokens, stream=c.stream, headers=c.headers,
                         body=c.body) for c in self.programs])

    @model_validator(mode="after")
    def _unique(self) -> AgentWorkload:
        names = [c.name for c in self.programs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"program class names must be unique, repeated: {dup}")
        return self


def is_agent_workload(data: Any) -> bool:
    """Whether a workload file's data describes programs (`programs:`) rather than requests."""
    return isinstance(data, dict) and "programs" in data


def parse_agents(data: dict[str, Any], where: str = "workload") -> AgentWorkload:
    try:
        return AgentWorkload.model_validate(data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{where}: invalid agent workload:\n  " + "\n  ".join(lines)) from None


def agent_workload(source: Any) -> AgentWorkload | None:
    """`source` as an agent workload: one already, or a YAML file with `programs:`; None otherwise
    (a request workload, a built-in name)."""
    if isinstance(source, AgentWorkload):
        return source
    if not isinstance(source, (str, Path)) or not str(source).endswith((".yaml", ".yml")):
        return None
    path = Path(source)
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not is_agent_workload(data):
        return None
    data.setdefault("name", path.stem)
    return parse_agents(data, where=str(path))


# --- the plan ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Step:
    """One step of a program: the tool result appended before it (0 tokens for the first step)
    after a gap of `gap_s` from the previous step's last answer, and each sibling call's output
    limit (one per call the step sends at once)."""

    tool_tokens: int
    gap_s: float
    max_tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProgramPlan:
    """One program, drawn: its index, class, due start (seconds from the run's start), task size
    and steps."""

    index: int
    cls: str
    start_s: float
    task_tokens: int
    steps: tuple[Step, ...]

    @property
    def calls(self) -> int:
        return sum(len(s.max_tokens) for s in self.steps)


def plan_programs(w: AgentWorkload, rate: float, seed: int = 0) -> Iterator[ProgramPlan]:
    """The programs of an open-loop run, in start order, for ever: Poisson arrivals at `rate`
    programs a second, each class drawn by weight, every draw seeded by (seed, purpose)."""
    gaps = arrival_gaps(rate, "poisson", 1.0, random.Random(f"{seed}:program-arrivals"))
    pick = random.Random(f"{seed}:program-classes")
    names = [c.name for c in w.programs]
    weights = [c.weight for c in w.programs]
    draws = {c.name: random.Random(f"{seed}:program:{c.name}") for c in w.programs}
    by_name = {c.name: c for c in w.programs}
    at, index = 0.0, 0
    while True:
        c = by_name[pick.choices(names, weights=weights)[0]]
        rng = draws[c.name]
        task = c.task_tokens.sample(rng)
        steps = []
        for i in range(c.steps.sample(rng)):
            tool = c.tool_tokens.sample(rng) if i else 0
            gap = c.tool_gap_s.sample(rng) if i else 0.0
            steps.append(Step(tool, gap, tuple(c.max_tokens.sample(rng) for _ in range(c.parallel.sample(rng)))))
        yield ProgramPlan(index, c.name, at, task, tuple(steps))
        index += 1
        at += next(gaps)
