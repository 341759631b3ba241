"""The DES and the gateway let the same request in the same way: the same class, the same refusal,
the same limit sent upstream and the same job size, over every cap mode and every class source.

Each row is a workload class. The gateway side sends the bench's own request for it
(`RequestFactory`) to a real gateway over loopback in front of the simulator (output length
exact, so the tokens generated are the limit it received), reading the status, the error code,
`X-Tailguard-Class` and the usage; the front's `Arrive` events say the job size it was given.
The DES side draws the same request (`sweep.virtual.plan`) and runs it through
`sweep.virtual.simulate`, the sweep's one call into the DES. The rows run one at a time, in order,
on both sides, so the output estimate (a request without a limit) learns the same things.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from tailguard.bench.stream import RequestFactory
from tailguard.bench.workload import parse_workload
from tailguard.front.events import Arrive, Decision, Event
from tailguard.front.front import Front
from tailguard.front.intake import NO_CLASS
from tailguard.config import GatewayConfig
from tailguard.gateway.http.keys import DISPATCHER
from tailguard.sim.cost import EngineConfig
from tailguard.sweep.virtual import plan, simulate
from tailguard.types import Outcome
from tests.functional.gateways import engine, gateway

MAX_MODEL_LEN = 512  # what a request without any limit may generate, prompt included
GATEWAY: dict[str, Any] = {
    "classes": [
        {"name": "interactive", "rank": 0},  # no cap
        {"name": "batch", "rank": 1, "max_tokens_cap": 8, "preemptible": True},  # clamp
        {"name": "strict", "rank": 2, "max_tokens_cap": 8, "cap_mode": "reject"},
        {"name": "filled", "rank": 3, "default_max_tokens": 6, "max_tokens_cap": 12},
        {"name": "short", "rank": 4, "max_prompt_tokens": 40},
    ],
    "default_class": "interactive",
    "service_tier_map": {"scale": "filled"},
    "auth": {"api_keys": {"k-plain": {"name": "plain"}, "k-batch": {"name": "reports", "default_class": "batch"},
                          "k-narrow": {"name": "narrow", "allowed_classes": ["interactive"],
                                       "allowed_models": ["tailguard-sim"]}}},
}
PLAIN = {"Authorization": "Bearer k-plain"}


def _row(name: str, cls: str | None, code: str | None, upstream: int | str | None, *, header: str | None = None,
         key: str = "k-plain", max_tokens: int | None = 20, prompt_tokens: int = 30, status: int = 400, **body: Any,
         ) -> tuple[dict[str, Any], tuple[str | None, str | None, int | str | None, int]]:
    """A workload class and what both sides must make of it: (class, error code, limit upstream,
    status), the limit "none" when the request goes up without one (the engine's own: up to the
    context), the status 200 when it has no error code."""
    headers = {"Authorization": f"Bearer {key}", **({"X-Tailguard-Class": header} if header else {})}
    wc: dict[str, Any] = {"name": name, "prompt_tokens": prompt_tokens, "headers": headers, "stream": False,
                          "body": body}
    if max_tokens is None:
        wc["body"] = {**body, "max_tokens": None}  # the bench always sends one unless the body says null
    else:
        wc["max_tokens"] = max_tokens
    return wc, (cls, code, upstream, 200 if code is None else status)


ROWS = [
    # cap modes
    _row("no-cap", "interactive", None, 20, header="interactive"),
    _row("no-cap-no-limit", "interactive", None, "none", header="interactive", max_tokens=None),
    _row("clamp", "batch", None, 8, header="batch"),
    _row("clamp-within", "batch", None, 5, header="batch", max_tokens=5),
    _row("clamp-fills-the-cap", "batch", None, 8, header="batch", max_tokens=None),
    _row("clamp-completion-field", "batch", None, 8, header="batch", max_completion_tokens=30),
    _row("reject", "strict", "max_tokens_over_cap", None, header="strict"),
    _row("reject-within", "strict", None, 8, header="strict", max_tokens=8),
    _row("default-fills", "filled", None, 6, header="filled", max_tokens=None),
    _row("default-then-cap", "filled", None, 12, header="filled", max_tokens=30),
    _row("prompt-too-long", "short", "prompt_too_long", None, header="short", prompt_tokens=41),
    _row("prompt-within", "short", None, 20, header="short", prompt_tokens=40),
    # class sources
    _row("header-over-tier-and-key", "strict", None, 3, header="strict", key="k-batch", max_tokens=3,
         service_tier="flex"),
    _row("service-tier-built-in", "batch", None, 8, service_tier="flex"),
    _row("service-tier-mapped", "filled", None, 6, max_tokens=None, service_tier="scale"),
    _row("service-tier-auto-falls-through", "batch", None, 8, key="k-batch", service_tier="auto"),
    _row("api-key-default", "batch", None, 8, key="k-batch"),
    _row("default-class", "interactive", None, 7, max_tokens=7),
    _row("default-class-no-limit", "interactive", None, "none", max_tokens=None, prompt_tokens=60),
    _row("unknown-class", None, "unknown_class", None, header="gold"),
    _row("unknown-service-tier", None, "invalid_value", None, service_tier="turbo"),
    # a key's rights: 403, counted by the DES as the gateway answers it
    _row("class-allowed", "interactive", None, 20, header="interactive", key="k-narrow", model="tailguard-sim"),
    _row("class-not-allowed", None, "class_not_allowed", None, header="batch", key="k-narrow", status=403),
    _row("model-not-allowed", "interactive", "model_not_allowed", None, key="k-narrow", model="other", status=403),
]


@dataclass(frozen=True)
class Seen:
    """What one side made of a request: its status, its class, the error it got, the tokens the
    engine was let generate, and what the front was told (job size, limit, caller, whether it may
    be suspended)."""

    status: int
    cls: str | None
    code: str | None
    generated: int | None
    arrive: tuple[int, int | None, str | None, bool] | None


def told(ev: Arrive, front: Front) -> tuple[int, int | None, str | None, bool]:
    # Whether the front may suspend it (and its driver keeps its text): `Front.tracks`, the one
    # rule both drivers ask.
    return ev.est_tokens, ev.max_tokens, ev.caller, front.tracks(ev.cls, ev.resumable)


class Told:
    """Every `Arrive` each front is told, by front."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_front: dict[int, dict[str, Arrive]] = {}
        handle = Front.handle

        def spy(front: Front, event: Event, now: float, *, preempt: bool = True) -> Sequence[Decision]:
            if isinstance(event, Arrive):
                self.by_front.setdefault(id(front), {})[event.id] = event
            return handle(front, event, now, preempt=preempt)

        monkeypatch.setattr(Front, "handle", spy)


def workload() -> Any:
    return parse_workload({"name": "conformance", "classes": [wc for wc, _ in ROWS]})


async def gateway_side(told_: Told) -> dict[str, Seen]:
    """Each row's request, as the bench sends it, through a real gateway to the simulator."""
    wl = workload()
    factory = RequestFactory(wl, seed=3)
    seen: dict[str, Seen] = {}
    eng = engine(output_length="exact", max_model_len=MAX_MODEL_LEN, kv_cache_tokens=8192)
    async with gateway(engine_cfg=eng, **GATEWAY) as gw, aiohttp.ClientSession() as s:
        front = gw.app[DISPATCHER].front
        for i, c in enumerate(wl.classes):
            req = factory.make(i, c.name)
            before = set(told_.by_front.get(id(front), {}))
            async with s.post(gw.url + req.path, data=req.body,
                              headers={"Content-Type": "application/json", **dict(req.headers)}) as r:
                body = orjson.loads(await r.read())
                cls = r.headers.get("X-Tailguard-Class")
            new = [ev for rid, ev in told_.by_front.get(id(front), {}).items() if rid not in before]
            assert len(new) <= 1, c.name
            seen[c.name] = Seen(
                r.status, cls, body["error"]["code"] if r.status != 200 else None,
                body["usage"]["completion_tokens"] if r.status == 200 else None,
                told(new[0], front) if new else None)
    return seen


def des_side(told_: Told) -> dict[str, Seen]:
    """The same draws through the sweep's DES, one request every 1000 simulated seconds."""
    wl = workload()
    factory = RequestFactory(wl, seed=3)
    gw = GatewayConfig.model_validate(
        {**GATEWAY, "backends": [{"name": "engine", "url": "http://127.0.0.1:1", "kind": "sim"}]})
    draws = []
    for i, c in enumerate(wl.classes):
        req = factory.make(i, c.name)
        draws.append(plan(c.name, 1000.0 * i, wl.endpoint, c, req.prompt_tokens, req.max_tokens))
    eng = EngineConfig.from_preset("h100-llama8b", max_num_seqs=8, max_model_len=MAX_MODEL_LEN,
                                   kv_cache_tokens=8192, output_length="exact")
    timelines, _ = simulate(eng, gw, draws, None)
    [arrived] = told_.by_front.values()
    front = Front(gw.front_params({"engine": True}))
    return {tl.id: Seen(
        tl.status or (200 if tl.outcome is Outcome.SUCCESS else 503),
        None if tl.cls == NO_CLASS else tl.cls, tl.reject_reason if tl.outcome is Outcome.CLIENT_ERROR else None,
        tl.output_tokens if tl.outcome is Outcome.SUCCESS else None,
        told(arrived[tl.id], front) if tl.id in arrived else None) for tl in timelines}


async def test_the_des_and_the_gateway_let_each_request_in_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    on_des = des_side(Told(monkeypatch))
    monkeypatch.undo()
    told_ = Told(monkeypatch)
    async with asyncio.timeout(60):
        on_gateway = await gateway_side(told_)
    for wc, (cls, code, upstream, status) in ROWS:
        name = wc["name"]
        g, d = on_gateway[name], on_des[name]
        assert g == d, name
        assert (g.status, g.cls, g.code) == (status, cls, code), name
        prompt = wc["prompt_tokens"]
        generated = MAX_MODEL_LEN - prompt if upstream == "none" else upstream
        assert g.generated == generated, name
        if code is None:  # let in: its job size is its prompt and its limit (or the estimate)
            assert g.arrive is not None and g.arrive[1] == (None if upstream == "none" else upstream), name
        else:
            assert g.arrive is None, name
    # Without any limit the size is the class's output estimate: the initial one, then what its
    # requests generated (each replacing or moving the running average the same way on both sides).
    assert on_gateway["no-cap-no-limit"].arrive is not None and on_gateway["no-cap-no-limit"].arrive[0] == 30 + 20
    assert on_gateway["default-class-no-limit"].arrive != on_gateway["no-cap-no-limit"].arrive
    assert on_gateway["clamp"].arrive == (30 + 8, 8, "plain", True)
    assert on_gateway["api-key-default"].arrive == (30 + 8, 8, "reports", True)
