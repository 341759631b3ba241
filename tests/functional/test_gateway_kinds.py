"""`kind: auto`: the gateway asks each backend what it is, at start and whenever it comes back,
and gives it the protection its kind allows, without a probe that hangs holding anything up."""

from __future__ import annotations

import asyncio
from typing import Any

from tailguard.config import BackendConfig
from tests.functional.gateways import classes, engine, gateway, health, sample, scrape, until
from tests.functional.raw_servers import never_answers, raw_server

CHAT = [{"role": "user", "content": "y" * 40}]
BATCH = {"X-Tailguard-Class": "batch"}
CFG: dict[str, Any] = {"classes": classes(batch={"preemptible": True, "max_share": 1.0}),
                       "scheduler": {"min_run_s": 0.0}}


async def _kind(url: str, name: str) -> str:
    return str((await health(url))["backends"][name]["kind"])


async def test_the_simulator_is_found_and_its_batch_requests_can_be_suspended() -> None:
    async with asyncio.timeout(30), gateway(kind="auto", max_concurrency=1, scale=0.05, **CFG) as gw, \
            gw.client() as c:
        async def detected() -> bool:
            return await _kind(gw.url, "sim0") == "sim"
        await until(detected)
        m = await scrape(gw.url)
        assert sample(m, "tailguard_backend_kind", backend="sim0", kind="sim") == 1
        assert (await health(gw.url))["backends"]["sim0"]["reserved_slots"] == 0
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2000, stream=True,
                                                 extra_headers=BATCH)
        got = 0
        chat = None
        async for ch in stream:
            got += sum(1 for choice in ch.choices if choice.delta.content)
            if got == 50 and chat is None:
                chat = asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4))
        assert chat is not None and (await chat).choices[0].message.content == " tok" * 4
        assert got == 2000
        m = await scrape(gw.url)
    assert sample(m, "tailguard_preemptions_total", **{"class": "batch"}) == 1


async def test_a_server_that_answers_none_of_the_probes_is_openai_with_a_reservation() -> None:
    async with asyncio.timeout(30), raw_server(never_answers) as hung, \
            gateway(extra_backends=[BackendConfig(name="hung", url=hung, max_concurrency=4)],
                    health={"timeout_s": 0.3, "interval_s": 0.1}, timeouts={"header_s": 1.0}) as gw, \
            gw.client() as c:
        # Start-up did not wait for the hung server's probes; a request sent to it is retried on
        # the simulator once the hung server has not even answered with headers.
        ok = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1, extra_headers=BATCH)
        assert ok.choices[0].message.content == " tok"
        h = await health(gw.url)
        assert h["backends"]["hung"]["kind"] == "openai" and h["backends"]["hung"]["reserved_slots"] == 1


async def test_health_shows_the_engines_own_queue_when_the_cap_is_above_its_slots() -> None:
    """The load page each kind has (vLLM's names, which the simulator exports) is read with every
    probe: a gateway cap of 4 over an engine of 2 sequences leaves requests waiting in the engine."""
    async with asyncio.timeout(30), gateway(max_concurrency=4, engine_cfg=engine(max_num_seqs=2), scale=0.05,
                                            health={"interval_s": 0.05}) as gw, gw.client() as c:
        streams = [asyncio.create_task(c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3000))
                   for _ in range(4)]

        async def queued_in_engine() -> bool:
            load = (await health(gw.url))["backends"]["sim0"]["engine"]
            # The probe's figures, with how old they are (probes every 0.05 s: fresh).
            return load is not None and (load["running"], load["waiting"]) == (2, 2) and 0 <= load["age_s"] < 5
        await until(queued_in_engine)
        m = await scrape(gw.url)
        for s in streams:
            s.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    assert sample(m, "tailguard_backend_engine_requests", backend="sim0", state="waiting") == 2
