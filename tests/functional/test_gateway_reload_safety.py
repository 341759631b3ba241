"""Reloads that cannot silently weaken a running gateway: a real `tailguard serve --config`
process, its config file rewritten and reloaded as an operator (or an editor saving half a file)
would. A config that drops every key is refused unless confirmed; a leftover reload request is
ignored; the state directory is made private."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import time
from pathlib import Path

import aiohttp
import orjson
import yaml

from tailguard.sim.server import running_sim
from tests.functional.gateways import engine
from tests.functional.test_gateway_rollback import SCALE, gateway_yaml, health, serving, tailguard

KEY = "sk-prod-4f9a7c1e2b"
CHAT = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})


async def _status(url: str, key: str | None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/chat/completions", data=CHAT, headers=headers) as r:
        return r.status


async def _until_config(url: str, changed_from: object, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while (await health(url))["config"] == changed_from:
            await asyncio.sleep(0.02)


async def test_a_half_written_config_that_drops_auth_is_refused_and_auth_stays_on(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        whole = gateway_yaml(sim.url, 2, 4096) + yaml.safe_dump({"auth": {"api_keys": {KEY: {"name": "prod"}}}})
        path.write_text(whole)
        async with serving(path) as (proc, url):
            assert await _status(url, None) == 401 and await _status(url, KEY) == 200
            path.write_text(whole[:whole.index("auth:")])  # an editor's save, cut off before `auth:`
            code, out = await tailguard("config", "reload", "-c", str(path))
            assert code == 1 and "no auth.api_keys" in out and "--allow-auth-change" in out, out
            assert KEY not in out
            proc.send_signal(signal.SIGHUP)  # a bare signal is refused the same way
            await asyncio.sleep(0.3)
            assert await _status(url, None) == 401
            code, out = await tailguard("config", "reload", "-c", str(path), "--allow-auth-change")
            assert code == 0, out
            assert await _status(url, None) == 200  # confirmed: now it is meant


async def test_a_leftover_reload_request_does_not_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    state = tmp_path / ".tailguard" / "gw"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(gateway_yaml(sim.url, 2, 4096))
        async with serving(path) as (proc, url):
            before = (await health(url))["config"]
            # A CLI that died after writing its request, long ago, for another config.
            (state / "reload.request").write_bytes(orjson.dumps(
                {"id": "old", "n": 1, "how": "rollback to 1", "made_for": "0ld0ld0ld0ld", "at": time.time() - 3600}))
            path.write_text(gateway_yaml(sim.url, 3, 4096))
            proc.send_signal(signal.SIGHUP)
            await _until_config(url, before)
            assert (await health(url))["backends"]["sim"]["max_concurrency"] == 3  # type: ignore[index]
            assert not (state / "reload.request").exists()


async def test_the_state_directory_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    state = tmp_path / ".tailguard" / "gw"
    state.mkdir(parents=True)
    os.chmod(state, 0o777)
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(yaml.safe_dump(yaml.safe_load(gateway_yaml(sim.url, 2, 4096))))
        async with serving(path):
            assert stat.S_IMODE(state.stat().st_mode) == 0o700
            assert all(stat.S_IMODE(p.stat().st_mode) in (0o600, 0o700) for p in state.rglob("*"))
