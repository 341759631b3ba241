"""Workloads: the YAML model of request classes, the built-in mixes, and the seeded request stream
and arrival schedule they produce. Pure: no I/O beyond reading the workload and dataset files.

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
Same seed, same stream: classes, prompt lengths and texts come from RNGs seeded by (seed, purpose).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Union

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from tailguard.bench.dataset import DatasetFormat, load_dataset
from tailguard.errors import ConfigError
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, synthetic_text, text_tokens

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


# --- the request stream ---------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class PlannedRequest:
    """One request, ready to send: the body is encoded once, before its due time."""

    index: int
    cls: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    prompt_tokens: int
    max_tokens: int
    stream: bool
    endpoint: Endpoint = "chat"
    session: str | None = None  # a trace's session, sent as `user` and x-session-id (recorded as it is)


class _TextPool:
    """Synthetic text for many prompts at the cost of one: slices of a long `synthetic_text`
    start at random offsets, so prompts differ from their first token (no accidental prefix
    hits) and each slice of 4*n ASCII bytes counts as exactly n tokens."""

    def __init__(self, rng: random.Random, tokens: int = 1 << 15) -> None:
        self._text = synthetic_text(tokens, rng)
        self._rng = rng

    def take(self, n_tokens: int) -> str:
        size = n_tokens * 4
        if size > len(self._text) // 2:
            return synthetic_text(n_tokens, self._rng)
        start = self._rng.randrange(0, len(self._text) - size)
        return self._text[start:start + size]


class RequestFactory:
    """Builds the seeded request stream. `next()` draws the class by weight; `make(index, cls)`
    builds a given class's request. Call them in index order: same seed, same stream."""

    def __init__(self, workload: Workload, *, seed: int = 0, model: str | None = None,
                 base_dir: Path | None = None) -> None:
        self.workload = workload
        self._model = model
        self._classes = {c.name: c for c in workload.classes}
        # Closed loop draws every class by weight; in open loop the classes with their own
        # arrival process leave the shared --rate to the others.
        self._all = _WeightedChoice([c for c in workload.classes if c.weight > 0])
        self._shared = _WeightedChoice([c for c in workload.classes if c.arrival is None and c.weight > 0])
        self._pick_rng = random.Random(f"{seed}:classes")
        self._len_rng = {c.name: random.Random(f"{seed}:lengths:{c.name}") for c in workload.classes}
        self._text_rng = random.Random(f"{seed}:text")
        # Built now, before any clock runs: built on first use it cost the first request ~8 ms
        # of dispatch lag, enough to mark a short run invalid.
        self._pool = _TextPool(self._text_rng)
        self._shared_system = {
            c.name: synthetic_text(c.system_prompt.tokens, random.Random(f"{seed}:system:{c.name}"))
            for c in workload.classes if c.system_prompt is not None and c.system_prompt.shared
        }
        self._datasets = {c.name: load_dataset(c.source.path, c.source.format, base_dir)
                          for c in workload.classes if c.source is not None}
        self._dataset_pos = {name: 0 for name in self._datasets}
        self._index = 0

    @property
    def shares_rate(self) -> bool:
        """True if some class takes its arrivals from the global --rate."""
        return bool(self._shared.names)

    def pick_class(self, *, shared_only: bool = False) -> str:
        choice = self._shared if shared_only else self._all
        if not choice.names:
            raise ConfigError("no class has a weight > 0")
        return self._pick_rng.choices(choice.names, cum_weights=choice.cum_weights)[0]

    def next(self, cls: str | None = None) -> PlannedRequest:
        """The next request of the stream (class drawn by weight unless given)."""
        req = self.make(self._index, cls if cls is not None else self.pick_class())
        self._index += 1
        return req

    def make(self, index: int, cls: str) -> PlannedRequest:
        c = self._classes[cls]
        rng = self._len_rng[cls]
        if c.source is not None:
            body, endpoint, prompt_tokens, max_tokens = self._from_dataset(c, rng)
        else:
            endpoint = c.endpoint or self.workload.endpoint
            prompt_tokens = c.prompt_tokens.sample(rng)
            max_tokens = c.max_tokens.sample(rng) if c.max_tokens is not None else DEFAULT_MAX_TOKENS
            body, prompt_tokens = self._synthetic_body(c, endpoint, prompt_tokens)
        body.update(request_fields(c, max_tokens, self._model, endpoint))
        return PlannedRequest(index, cls, ENDPOINT_PATHS[endpoint], orjson.dumps(body),
                              tuple(c.headers.items()), prompt_tokens, max_tokens,
                              c.stream and endpoint != "embeddings", endpoint)

    def _synthetic_body(self, c: RequestClass, endpoint: Endpoint, prompt_tokens: int) -> tuple[dict[str, Any], int]:
        system: str | None = None
        if c.system_prompt is not None:
            system = self._shared_system.get(c.name) or self._pool.take(c.system_prompt.tokens)
        if endpoint in ("completions", "embeddings"):
            sys_tokens = text_tokens(system) if system else 0
            user = self._pool.take(max(1, prompt_tokens - sys_tokens))
            text = (system or "") + user
            if endpoint == "embeddings":  # `inputs` pieces of the prompt, one request
                step = -(-len(text) // c.inputs)
                return {"input": [text[i:i + step] for i in range(0, len(text), step)]}, sys_tokens + text_tokens(user)
            return {"prompt": text}, sys_tokens + text_tokens(user)
        overhead = CHAT_MESSAGE_OVERHEAD_TOKENS * (2 if system and endpoint != "messages" else 1)
        sys_tokens = text_tokens(system) if system else 0
        user = self._pool.take(max(1, prompt_tokens - sys_tokens - overhead))
        if endpoint == "messages":  # Anthropic's: the system prompt is a field of its own
            return ({"system": system} if system else {}) | {"messages": [{"role": "user", "content": user}]}, \
                overhead + sys_tokens + text_tokens(user)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        key = "input" if endpoint == "responses" else "messages"
        return {key: messages}, overhead + sys_tokens + text_tokens(user)

    def _from_dataset(self, c: RequestClass, rng: random.Random) -> tuple[dict[str, Any], Endpoint, int, int]:
        assert c.source is not None
        prompts = self._datasets[c.name]
        if c.source.order == "sequential":
            pos = self._dataset_pos[c.name]
            self._dataset_pos[c.name] = pos + 1
            p = prompts[pos % len(prompts)]
        else:
            p = prompts[rng.randrange(len(prompts))]
        if c.max_tokens is not None:
            max_tokens = c.max_tokens.sample(rng)
        else:
            max_tokens = p.max_tokens or DEFAULT_MAX_TOKENS
        body = dict(p.body)
        body.pop("max_completion_tokens", None)
        return body, p.endpoint, p.prompt_tokens, max_tokens


def request_fields(c: RequestClass, max_tokens: int, model: str | None = None,
                   endpoint: Endpoint = "chat") -> dict[str, Any]:
    """What a request of class `c` carries besides its prompt: its output limit (as the route
    names it; none for embeddings), the model, the stream settings, then the class's own body
    fields (which may override any of them). The discrete-event runs build the same fields, so a
    simulated gateway reads what the real one would."""
    fields: dict[str, Any] = {}
    if endpoint != "embeddings":
        fields["max_output_tokens" if endpoint == "responses" else "max_tokens"] = max_tokens
    if model is not None:
        fields["model"] = model
    if endpoint != "embeddings":
        fields["stream"] = c.stream
    if c.stream and endpoint in ("chat", "completions"):
        fields["stream_options"] = {"include_usage": True}
    if c.ignore_eos:
        fields["ignore_eos"] = True
    fields.update(c.body)
    return fields


class _WeightedChoice:
    __slots__ = ("names", "cum_weights")

    def __init__(self, classes: list[RequestClass]) -> None:
        self.names = [c.name for c in classes]
        self.cum_weights: list[float] = []
        total = 0.0
        for c in classes:
            total += c.weight
            self.cum_weights.append(total)


# --- arrival schedules (open loop) --------------------------------------------------------------

def arrival_gaps(rate: float, process: ArrivalProcess, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Inter-arrival gaps in seconds at mean `rate` per second. gamma uses shape = burstiness
    (vllm bench's convention): 1 is Poisson, below 1 burstier, above 1 more regular."""
    if rate <= 0:
        raise ConfigError("rate must be > 0")
    if process == "constant":
        while True:
            yield 1.0 / rate
    elif process == "poisson":
        while True:
            yield rng.expovariate(rate)
    else:
        if burstiness <= 0:
            raise ConfigError("burstiness must be > 0")
        scale = 1.0 / (rate * burstiness)
        while True:
            yield rng.gammavariate(burstiness, scale)


def schedule(factory: RequestFactory, *, rate: float | None, process: ArrivalProcess = "poisson",
             burstiness: float = 1.0, seed: int = 0) -> Iterator[tuple[float, str]]:
    """The open-loop schedule: (due offset in seconds, class name), in time order and infinite.
    The global `rate` is split among weighted classes by weight; a class with its own `arrival`
    runs its own process. The first global arrival is due at 0."""
    heap: list[tuple[float, int, str | None, Iterator[float]]] = []
    if rate is not None and factory.shares_rate:
        gaps = arrival_gaps(rate, process, burstiness, random.Random(f"{seed}:arrivals"))
        heap.append((0.0, 0, None, gaps))
    for i, c in enumerate(factory.workload.classes, 1):
        if c.arrival is not None:
            gaps = arrival_gaps(c.arrival.rate, c.arrival.process, c.arrival.burstiness,
                                random.Random(f"{seed}:arrivals:{c.name}"))
            heap.append((next(gaps), i, c.name, gaps))
    if not heap:
        raise ConfigError("open loop needs --rate, or classes with their own arrival process")
    heapq.heapify(heap)
    while True:
        due, order, cls, gaps = heap[0]
        yield due, cls if cls is not None else factory.pick_class(shared_only=True)
        heapq.heapreplace(heap, (due + next(gaps), order, cls, gaps))
