"""A trace made ready to replay: read, cut to its window and limit, each request given its class,
and the bench's requests built from it one at a time (`TraceFactory`, the trace's twin of
`workload.RequestFactory`); pure (the trace and rule files read aside).

Each request is sent as the trace sized it: a prompt of exactly its input tokens as the gateway
and the simulator count them (the chat template's tokens included), `max_tokens` its output
length with `ignore_eos` (vLLM, SGLang and llama.cpp honour it, so the answer is that long; the
simulator always generates `max_tokens`), its session as `user` and as the `x-session-id`
header, and its class's headers and body fields. A trace size the API cannot express (an answer
of 0 tokens, a chat prompt shorter than its template) is raised to the least it can, and counted
in the notes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tailguard.bench.trace.blocks import PromptText, block_reuse
from tailguard.bench.trace.formats import read_trace
from tailguard.bench.trace.request import Trace, TraceRequest
from tailguard.bench.trace.rules import UNMATCHED, Rules, TraceClass, load_rules
from tailguard.bench.trace.timing import Window, select
from tailguard.bench.stream import PlannedRequest, request_fields
from tailguard.bench.workload import ENDPOINT_PATHS, Endpoint, Workload
from tailguard.errors import ConfigError
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS

SESSION_HEADER = "x-session-id"  # the session header of issue "Agent programs" (x-tailguard-program's twin)
TRACE_ENDPOINTS = ("chat", "completions")


@dataclass(frozen=True)
class TraceSpec:
    """What `bench --trace` was asked: the file, its format (None: found from its first line),
    the part replayed and how fast, the rule file, whether answers are forced to full length."""

    path: str
    format: str | None = None
    speed: float = 1.0
    window: str | None = None
    limit: int | None = None
    rules: str | None = None
    ignore_eos: bool = True


@dataclass(frozen=True)
class Replay:
    """The trace as it will be replayed: the requests kept (`at` as replayed) and each one's class."""

    spec: TraceSpec
    trace: Trace
    requests: list[TraceRequest]
    classes: list[TraceClass]  # per request
    rules: Rules | None

    @property
    def class_names(self) -> list[str]:
        return list(dict.fromkeys(c.name for c in self.classes))


def _default_class(r: TraceRequest) -> TraceClass:
    """Without a rule file: the class the record names (a gateway's class sent again as its
    header), else `trace`."""
    name = r.class_header or r.cls or "trace"
    return TraceClass(name=name, headers={"X-Tailguard-Class": r.class_header} if r.class_header else {})


def load_replay(spec: TraceSpec) -> Replay:
    """Read, cut and classify; every error a `ConfigError` that says where."""
    trace = read_trace(spec.path, spec.format)
    window = Window.parse(spec.window) if spec.window is not None else None
    requests = select(trace.requests, window=window, speed=spec.speed, limit=spec.limit)
    if spec.rules is None:
        cache: dict[tuple[str | None, str | None], TraceClass] = {}
        classes = [cache.setdefault((r.cls, r.class_header), _default_class(r)) for r in requests]
        return Replay(spec, trace, requests, classes, None)
    rules = load_rules(spec.rules)
    rules.check(trace.field_names(), spec.rules)
    other = TraceClass(name=UNMATCHED)
    return Replay(spec, trace, requests, [rules.classify(r) or other for r in requests], rules)


class TraceFactory:
    """The replay's requests, built one at a time just before each is due (a long trace's text is
    never all in memory). `schedule()` gives (due offset, class) in order; `next()` builds the
    next one. The same seed gives the same texts."""

    def __init__(self, replay: Replay, *, seed: int = 0, model: str | None = None,
                 endpoint: Endpoint | None = None) -> None:
        if endpoint is not None and endpoint not in TRACE_ENDPOINTS:
            raise ConfigError(f"a trace replays on chat or completions, not --endpoint {endpoint}")
        self.replay = replay
        self._model = model
        self._endpoint = endpoint
        self._texts = PromptText(seed, replay.trace.block_tokens, Path(replay.spec.path).name)
        self._request_classes = {c.name: c.request_class(replay.spec.ignore_eos) for c in replay.classes}
        self._index = 0

    def __len__(self) -> int:
        return len(self.replay.requests)

    @property
    def workload(self) -> Workload:
        """The replay as a workload (its classes, their SLOs), for the reports that read one."""
        return Workload(name=f"trace:{Path(self.replay.spec.path).name}",
                        description=f"{self.replay.trace.format} trace {self.replay.spec.path}",
                        classes=list(self._request_classes.values()))

    def schedule(self) -> Iterator[tuple[float, str]]:
        for r, c in zip(self.replay.requests, self.replay.classes):
            yield r.at, c.name

    def endpoint_of(self, r: TraceRequest) -> Endpoint:
        ep = self._endpoint or r.endpoint or "chat"
        return ep if ep in TRACE_ENDPOINTS else "chat"  # type: ignore[return-value]

    def next(self, cls: str | None = None) -> PlannedRequest:
        req = self.make(self._index)
        self._index += 1
        return req

    def make(self, index: int) -> PlannedRequest:
        r, c = self.replay.requests[index], self.replay.classes[index]
        rc = self._request_classes[c.name]
        endpoint = self.endpoint_of(r)
        overhead = CHAT_MESSAGE_OVERHEAD_TOKENS if endpoint == "chat" else 0
        text_tokens = max(1, r.input_tokens - overhead)
        text = self._texts.text(index, r.hash_ids, text_tokens)
        body: dict[str, Any] = ({"messages": [{"role": "user", "content": text}]} if endpoint == "chat"
                                else {"prompt": text})
        headers = dict(c.headers)
        if r.session is not None:
            body["user"] = r.session
            headers[SESSION_HEADER] = r.session
        max_tokens = max(1, r.output_tokens)
        body.update(request_fields(rc, max_tokens, self._model, endpoint))
        return PlannedRequest(index, c.name, ENDPOINT_PATHS[endpoint], orjson.dumps(body), tuple(headers.items()),
                              overhead + text_tokens, max_tokens, rc.stream, endpoint, session=r.session)

    def describe(self) -> dict[str, Any]:
        """What the replay is, for run.json and the report: the file, its part, its classes."""
        rp, spec = self.replay, self.replay.spec
        reqs = rp.requests
        short = sum(1 for r in reqs if r.input_tokens < (CHAT_MESSAGE_OVERHEAD_TOKENS + 1
                                                          if self.endpoint_of(r) == "chat" else 1))
        notes = list(rp.trace.notes)
        if short:
            notes.append(f"{short} prompt(s) shorter than the least the route can carry were sent at that least "
                         f"({CHAT_MESSAGE_OVERHEAD_TOKENS + 1} tokens for chat: the template's 4 and one of text)")
        empty = sum(1 for r in reqs if r.output_tokens < 1)
        if empty:
            notes.append(f"{empty} request(s) with 0 output tokens in the trace were sent with max_tokens 1")
        reuse = block_reuse(reqs, rp.trace.block_tokens)
        return {
            "file": spec.path, "format": rp.trace.format, "requests": len(reqs),
            "requests_in_file": len(rp.trace.requests), "span_s": round(reqs[-1].at, 6) if reqs else 0.0,
            "speed": spec.speed, "window": spec.window, "limit": spec.limit, "rules": spec.rules,
            "ignore_eos": spec.ignore_eos, "classes": dict(Counter(c.name for c in rp.classes)),
            "sessions": len({r.session for r in reqs if r.session is not None}),
            "block_tokens": rp.trace.block_tokens or None,
            "block_reuse": None if reuse is None else round(reuse, 4),
            "notes": notes,
        }
