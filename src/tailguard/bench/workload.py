"""Workloads: the YAML model of request classes and the built-in mixes; the request stream and
arrival schedule they produce are `bench.stream`'s. Pure: no I/O beyond reading the workload file.

A workload file looks like this (every field but `name` and `classes` is optional):

    name: my-mix
    endpoint: chat                      # or completions, responses, messages, embeddings
    classes:
      - name: chat
        weight: 0.9                     # share of the global --rate / of closed-loop picks
        prompt_tokens: {dist: lognormal, median: 120, sigma: 0.5, max: 2000}
        max_tokens: 32                  # or a distribution, like prompt_tokens
        stream: true
        headers: {X-Tailguard-Class: interactive}
        body: {service_tier: priority}
        system_prompt: {tokens: 300, shared: true}
        slo: {ttft_s: 0.5, e2e_s: 2.0}
      - name: nightly
        arrival: {rate: 0.5, process: poisson}   # its own open-loop process, independent of --rate
        source: {path: prompts.jsonl, format: openai}

`prompt_tokens` is the whole prompt as the server counts it (`wire.tokens`: system prompt, user
text and the per-message chat overhead), so a synthetic request's `usage.prompt_tokens` equals it.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from tailguard.bench.dataset import DatasetFormat
from tailguard.errors import ConfigError

Endpoint = Literal["chat", "completions", "responses", "messages", "embeddings"]
ENDPOINTS: tuple[str, ...] = ("chat", "completions", "responses", "messages", "embeddings")
ArrivalProcess = Literal["constant", "poisson", "gamma"]
ENDPOINT_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
                                  "responses": "/v1/responses", "messages": "/v1/messages",
                                  "embeddings": "/v1/embeddings"}
DEFAULT_MAX_TOKENS = 256  # a class with no max_tokens, and a dataset row without one


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- length distributions -------------------------------------------------------------------

class Fixed(_Model):
    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1)

    @model_serializer
    def _as_int(self) -> int:
        return self.value  # written back as the shorthand `max_tokens: 32`

    def sample(self, rng: random.Random) -> int:
        return self.value


class Uniform(_Model):
    dist: Literal["uniform"]
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"uniform: high ({self.high}) is below low ({self.low})")
        return self

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


class _Clipped(_Model):
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)

    def _clip(self, x: float) -> int:
        n = max(self.min, int(round(x)))
        return min(n, self.max) if self.max is not None else n


class Normal(_Clipped):
    dist: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)

    def sample(self, rng: random.Random) -> int:
        return self._clip(rng.gauss(self.mean, self.std))


class LogNormal(_Clipped):
    """Parameterised by the median (exp(mu)) and sigma of the underlying normal."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)

    def sample(self, rng: random.Random) -> int:
        return self._clip(rng.lognormvariate(math.log(self.median), self.sigma))


Distribution = Annotated[Union[Fixed, Uniform, Normal, LogNormal], Field(discriminator="dist")]


def _int_is_fixed(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        return {"dist": "fixed", "value": v}
    return v


# --- classes and the workload ----------------------------------------------------------------

class SystemPrompt(_Model):
    """`shared: true` sends the same system text with every request of the class (a common prefix
    for prefix caches); `shared: false` draws fresh text per request."""

    tokens: int = Field(ge=1)
    shared: bool = True


class SLO(_Model):
    """Per-class service level for goodput: a request is good when it succeeded and met every limit set."""

    ttft_s: float | None = Field(default=None, gt=0)
    tpot_s: float | None = Field(default=None, gt=0)
    e2e_s: float | None = Field(default=None, gt=0)


class Arrival(_Model):
    """A class's own open-loop arrival process (requests per second), independent of --rate."""

    rate: float = Field(gt=0)
    process: ArrivalProcess = "poisson"
    burstiness: float = Field(default=1.0, gt=0)


class DatasetSource(_Model):
    """Prompts from a file instead of synthetic text: JSONL of OpenAI request bodies, or ShareGPT
    (a JSON array or JSONL of {"conversations": [{"from": "human", "value": ...}, ...]})."""

    path: str
    format: DatasetFormat = "openai"
    order: Literal["random", "sequential"] = "random"


class RequestClass(_Model):
    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, ge=0)
    arrival: Arrival | None = None
    prompt_tokens: Distribution = Fixed(value=128)
    max_tokens: Distribution | None = None
    stream: bool = True
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, Any] = Field(default_factory=dict)
    system_prompt: SystemPrompt | None = None
    slo: SLO | None = None
    ignore_eos: bool = False
    source: DatasetSource | None = None
    endpoint: Endpoint | None = None  # the class's own route (else the workload's), e.g. an embeddings batch
    inputs: int = Field(default=1, ge=1)  # embeddings: the prompt split into this many inputs of one request

    @field_validator("prompt_tokens", "max_tokens", mode="before")
    @classmethod
    def _fixed_shorthand(cls, v: Any) -> Any:
        return _int_is_fixed(v)


class Workload(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    endpoint: Endpoint = "chat"
    classes: list[RequestClass] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Workload:
        names = [c.name for c in self.classes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"class names must be unique, repeated: {dup}")
        if not any(c.arrival is not None or c.weight > 0 for c in self.classes):
            raise ValueError("at least one class needs a weight > 0 or its own arrival process")
        for c in self.classes:
            if c.system_prompt and c.source:
                raise ValueError(f"class {c.name!r}: system_prompt does not apply to a dataset source")
        return self

    def slos(self) -> dict[str, dict[str, float]]:
        return {c.name: c.slo.model_dump(exclude_none=True) for c in self.classes if c.slo is not None}


# --- built-ins --------------------------------------------------------------------------------

_CHAT: dict[str, Any] = {
    "name": "chat", "prompt_tokens": {"dist": "uniform", "low": 64, "high": 192}, "max_tokens": 32,
    "headers": {"X-Tailguard-Class": "interactive"}, "slo": {"ttft_s": 1.0, "e2e_s": 2.0},
}
BUILTIN_WORKLOADS: dict[str, dict[str, Any]] = {
    # The seed article's service: mostly chat, some summaries. One request in twelve is a summary:
    # a summary holds its slot about 60 times longer than a chat, so with the seed's 16 closed-loop
    # clients summaries hold most of the engine's 8 slots most of the time, and now and then all
    # of them. Most chats get a slot within a chat or two; the unlucky ones wait for a summary to
    # finish. On the simulator (h100-llama8b, max_num_seqs 8) that puts chat E2E P99 at about 7x
    # P50 (benchmarks/seed_hol.py); with one summary in 25 it is only about 3x in a closed loop.
    "seed-mixed": {
        "name": "seed-mixed",
        "description": "Mostly 32-token chats (interactive) with some 2048-token summaries (batch).",
        "classes": [
            {**_CHAT, "weight": 0.92},
            {"name": "summary", "weight": 0.08, "prompt_tokens": {"dist": "uniform", "low": 128, "high": 384},
             "max_tokens": 2048, "headers": {"X-Tailguard-Class": "batch"}},
        ],
    },
    "long-prefill": {
        "name": "long-prefill",
        "description": "8,000-token prompts with short outputs (batch) mixed with chat (interactive).",
        "classes": [
            {**_CHAT, "weight": 0.8},
            {"name": "long", "weight": 0.2, "prompt_tokens": 8000, "max_tokens": 64,
             "headers": {"X-Tailguard-Class": "batch"}},
        ],
    },
    "chat-only": {
        "name": "chat-only",
        "description": "Only 32-token chats (interactive): the baseline without contention.",
        "classes": [{**_CHAT, "weight": 1.0}],
    },
    # What `--input-tokens` and `--output-tokens` shape when no workload is named: vllm bench's
    # random dataset, AIPerf's --isl/--osl, GuideLLM's synthetic data, with no YAML file.
    "fixed-lengths": {
        "name": "fixed-lengths",
        "description": "One class of 128-token prompts and 256-token answers; set both with --input-tokens and "
                       "--output-tokens.",
        "classes": [{"name": "default", "prompt_tokens": 128, "max_tokens": 256}],
    },
}


def load_workload(name_or_path: str | Path) -> tuple[Workload, Path | None]:
    """A built-in by name, or a YAML file; returns the workload and the folder its dataset paths
    are relative to. Errors are `ConfigError`s naming the file and field."""
    key = str(name_or_path)
    if key in BUILTIN_WORKLOADS:
        return Workload.model_validate(BUILTIN_WORKLOADS[key]), None
    path = Path(key)
    if not path.is_file():
        raise ConfigError(f"unknown workload {key!r}: not a file, and the built-ins are {sorted(BUILTIN_WORKLOADS)}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a workload is a mapping with 'name' and 'classes'")
    data.setdefault("name", path.stem)
    return parse_workload(data, where=str(path)), path.parent


def parse_workload(data: dict[str, Any], where: str = "workload") -> Workload:
    try:
        return Workload.model_validate(data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{where}: invalid workload:\n  " + "\n  ".join(lines)) from None


def parse_length(text: str, flag: str) -> Distribution:
    """A length on the command line: `512` (fixed), `512:64` (normal, mean and standard deviation,
    as AIPerf's --isl with --isl-stddev), `100..1000` (uniform, both ends included, as vllm bench's
    --random-range-ratio draws)."""
    t = text.strip()
    try:
        if ".." in t:
            lo, hi = (int(x) for x in t.split(".."))
            return Uniform(dist="uniform", low=lo, high=hi)
        if ":" in t:
            mean, std = (float(x) for x in t.split(":"))
            return Normal(dist="normal", mean=mean, std=std)
        return Fixed(value=int(t))
    except (ValueError, ValidationError) as e:
        why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else "not a number"
        raise ConfigError(f"{flag} {text!r}: 512 (fixed), 512:64 (normal: mean:stddev) or 100..1000 (uniform): "
                          f"{why}") from None


def with_lengths(w: Workload, input_tokens: Distribution | None, output_tokens: Distribution | None,
                 ignore_eos: bool | None) -> Workload:
    """`w` with every class's prompt and answer lengths replaced where given, and `ignore_eos` set
    where given (on by default with `output_tokens`: answers of the asked length, as AIPerf's docs
    advise for a fixed --osl)."""
    if input_tokens is None and output_tokens is None and ignore_eos is None:
        return w
    eos = ignore_eos if ignore_eos is not None else (True if output_tokens is not None else None)
    classes = []
    for c in w.classes:
        if input_tokens is not None and c.source is not None:
            raise ConfigError(f"--input-tokens: class {c.name!r} takes its prompts from {c.source.path}")
        update: dict[str, Any] = {}
        if input_tokens is not None:
            update["prompt_tokens"] = input_tokens
        if output_tokens is not None:
            update["max_tokens"] = output_tokens
        if eos is not None:
            update["ignore_eos"] = eos
        classes.append(c.model_copy(update=update))
    return w.model_copy(update={"classes": classes})


def workload_yaml(w: Workload) -> str:
    return yaml.safe_dump(w.model_dump(mode="json", exclude_defaults=True), sort_keys=False)
