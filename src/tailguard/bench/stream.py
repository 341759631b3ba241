"""The seeded request stream and open-loop arrival schedule a workload (`bench.workload`)
produces: each request's body encoded before its due time, the class drawn by weight, the arrival
gaps of each process. Pure: no I/O beyond reading a class's dataset file.
Same seed, same stream: classes, prompt lengths and texts come from RNGs seeded by (seed, purpose).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import orjson

from tailguard.bench.dataset import load_dataset
from tailguard.bench.workload import (
    DEFAULT_MAX_TOKENS, ENDPOINT_PATHS, ArrivalProcess, Endpoint, RequestClass, Workload,
)
from tailguard.errors import ConfigError
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, synthetic_text, text_tokens

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


class TextPool:
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
        self._pool = TextPool(self._text_rng)
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
