"""Engine truths found, not assumed: the README's own `kind: vllm` in front of `tailguard sim`
(which refuses a non-zero `priority` unless started with `--scheduling-policy priority`, as
vLLM's older engine does) serves batch requests: the first refusal is retried once without the
field, remembered for that backend, logged once and shown in `/health`."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tailguard.config import BackendConfig
from tests.functional.gateways import gateway, health, sample, scrape
from tests.functional.sim_processes import sim_process

CHAT = [{"role": "user", "content": "y" * 40}]
BATCH = {"X-Tailguard-Class": "batch"}


async def test_a_vllm_backend_without_priority_scheduling_serves_batch_requests(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tailguard.gateway")
    async with asyncio.timeout(60), sim_process() as sim, \
            gateway(sims=0, extra_backends=[BackendConfig(name="gpu-a", url=sim.url, kind="vllm", max_concurrency=8)]
                    ) as gw, gw.client() as c:
        assert (await health(gw.url))["backends"]["gpu-a"]["dropped_fields"] == []
        answers = await asyncio.gather(*(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3,
                                                                   extra_headers=BATCH) for _ in range(3)))
        assert [a.choices[0].message.content for a in answers] == [" tok" * 3] * 3
        later = await c.completions.create(model="tailguard-sim", prompt="x", max_tokens=2, extra_headers=BATCH)
        assert later.choices[0].text == " tok" * 2
        assert (await health(gw.url))["backends"]["gpu-a"]["dropped_fields"] == ["priority"]
        m = await scrape(gw.url)
    said = [r for r in caplog.records if "refuses the field 'priority'" in r.getMessage()]
    assert len(said) == 1 and "gpu-a" in said[0].getMessage()
    assert sample(m, "tailguard_requests_total", **{"class": "batch", "outcome": "success"}) == 4


async def test_a_vllm_backend_with_priority_scheduling_keeps_getting_the_field() -> None:
    async with asyncio.timeout(60), sim_process("--scheduling-policy", "priority") as sim, \
            gateway(sims=0, extra_backends=[BackendConfig(name="gpu-a", url=sim.url, kind="vllm", max_concurrency=8)]
                    ) as gw, gw.client() as c:
        a = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2, extra_headers=BATCH)
        assert a.choices[0].message.content == " tok" * 2
        assert (await health(gw.url))["backends"]["gpu-a"]["dropped_fields"] == []


async def test_a_clients_own_refused_field_is_its_answer_not_a_drop() -> None:
    """`kind: openai` adds no `priority`: the client's own (its key may set it) is refused with
    the engine's 400."""
    auth = {"api_keys": {"k": {"name": "ops", "allow_priority": True}}}
    async with asyncio.timeout(60), sim_process() as sim, \
            gateway(sims=0, extra_backends=[BackendConfig(name="plain", url=sim.url, kind="openai")], auth=auth) as gw, \
            gw.client() as c:
        with pytest.raises(Exception) as got:
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2,
                                            extra_body={"priority": 5})
        assert getattr(got.value, "status_code", None) == 400 and "Priority scheduling" in str(got.value)
        assert (await health(gw.url))["backends"]["plain"]["dropped_fields"] == []


@pytest.mark.parametrize("kind", ["openai", "tgi", "llamacpp", "sim", "vllm"])
async def test_a_clients_priority_never_reaches_an_engine_unless_its_key_may_set_it(kind: str) -> None:
    """A key's `priority: -100` on every kind: dropped (vLLM gets the class's own, interactive's
    0), so an engine whose queue is FCFS (the simulator refuses any other priority than 0, as vLLM
    does) serves it, where before it reached every kind but vllm and sglang as sent."""
    auth = {"api_keys": {"k": {"name": "nightly", "allowed_classes": ["interactive"]}}}
    async with asyncio.timeout(60), sim_process() as sim, \
            gateway(sims=0, extra_backends=[BackendConfig(name="e", url=sim.url, kind=kind)], auth=auth) as gw, \
            gw.client() as c:
        done = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2,
                                               extra_body={"priority": -100})
        assert done.choices[0].message.content == " tok" * 2
