"""A live reload reaches the deadlines and the health probes: a real `tailguard serve --config`
in front of a real simulator, the file rewritten and SIGHUP sent as an operator does. What starts
after the reload runs by the new settings, and a request in flight keeps the ones it started with."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tailguard.sim.server import running_sim
from tests.functional.gateways import engine, until
from tests.functional.test_gateway_rollback import CHAT, SCALE, gateway_yaml, health, serving

TOKENS = 2000  # about 3 s of wall time at SCALE: in flight across both reloads
PROBES = {"interval_s": 0.1}


async def reload(proc: asyncio.subprocess.Process, url: str, path: Path, text: str) -> None:
    """Rewrite the config file, send SIGHUP, and wait until the gateway runs the new config."""
    before = (await health(url))["config"]["hash"]  # type: ignore[index]
    path.write_text(text)
    proc.send_signal(signal.SIGHUP)

    async def applied() -> bool:
        return bool((await health(url))["config"]["hash"] != before)  # type: ignore[index]
    try:
        async with asyncio.timeout(10):
            await until(applied, step_s=0.02)
    except TimeoutError:
        raise AssertionError("the gateway did not apply the reloaded config (refused it?)") from None


async def test_a_reload_changes_deadlines_and_probes_for_what_starts_next(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(gateway_yaml(sim.url, 4, 4096, health=PROBES))
        async with serving(path) as (proc, url), AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
            def long() -> Any:
                return c.chat.completions.create(model="m", messages=CHAT, max_tokens=TOKENS)

            started_before = asyncio.create_task(long())

            async def running() -> bool:
                return bool((await health(url))["backends"]["sim"]["in_flight"] == 1)  # type: ignore[index]
            await until(running, step_s=0.02)

            await reload(proc, url, path, gateway_yaml(sim.url, 4, 4096, health=PROBES, timeouts={"total_s": 0.5}))
            with pytest.raises(openai.InternalServerError) as cut:
                await long()
            assert cut.value.status_code == 504 and "total deadline" in str(cut.value)

            await reload(proc, url, path, gateway_yaml(sim.url, 4, 4096, timeouts={"total_s": 0.5},
                                                       health={**PROBES, "path": "/no-such-page", "unhealthy_after": 1}))

            async def taken_out() -> bool:
                return (await health(url))["backends"]["sim"]["healthy"] is False  # type: ignore[index]
            await until(taken_out, step_s=0.02)
            assert (await health(url))["backends"]["sim"]["probe_error"] == "status 404"  # type: ignore[index]

            done = await started_before  # dispatched under the first config: its deadline was 600 s
            assert done.usage is not None and done.usage.completion_tokens == TOKENS
