"""Reloads that cannot silently weaken a running gateway, and apply what they say: a real
`tailguard serve --config` process, its config file rewritten and reloaded as an operator (or an
editor saving half a file) would. A config that drops every key, most of them or the admin key, or
opens /metrics to everyone, is refused unless forced, saying why; a setting only a start reads is
refused by name; what a reload says it applied (`state.on_unavailable` with a real redis-server
killed after it) is in force; a leftover reload request is ignored; the state directory is made
private."""

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
from tests.functional.redis_server import redis_server
from tests.functional.test_gateway_rollback import SCALE, gateway_yaml, health, serving, tailguard

KEY = "sk-prod-4f9a7c1e2b"
ADMIN = "adm-0123456789abcdef"
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
            assert code == 1 and "no auth.api_keys" in out and "--force" in out, out
            assert KEY not in out
            proc.send_signal(signal.SIGHUP)  # a bare signal is refused the same way
            await asyncio.sleep(0.3)
            assert await _status(url, None) == 401
            code, out = await tailguard("config", "reload", "-c", str(path), "--allow-auth-change")  # --force's old name
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


async def _admin(url: str, method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.request(method, f"{url}{path}", json=body,
                                                       headers={"Authorization": f"Bearer {ADMIN}"}) as r:
        return r.status, await r.json()


async def test_a_reload_that_drops_the_admin_key_or_most_keys_or_opens_metrics_needs_force(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    keys = {f"sk-client-{i}": {"name": f"c{i}"} for i in range(4)}
    base = yaml.safe_load(gateway_yaml("http://127.0.0.1:9", 2, 4096))
    async with asyncio.timeout(60):
        path.write_text(yaml.safe_dump({**base, "auth": {"api_keys": keys, "admin_keys": [ADMIN]}}))
        async with serving(path) as (_, url):
            for auth, why in [({"api_keys": keys, "admin_keys": []}, "removes every admin key in force"),
                              ({"api_keys": dict(list(keys.items())[:1]), "admin_keys": [ADMIN]},
                               "removes 3 of the 4 client keys"),
                              ({"api_keys": keys, "admin_keys": [ADMIN], "open_metrics": "always"},
                               "opens /metrics to every client")]:
                path.write_text(yaml.safe_dump({**base, "auth": auth}))
                code, out = await tailguard("config", "reload", "-c", str(path))
                assert code == 1 and why in out and "--force" in out, out
                status, said = await _admin(url, "POST", "/admin/reload")
                assert status == 409 and why in str(said["error"]) and '"force": true' in str(said["error"])
            assert (await _admin(url, "GET", "/config"))[1]["settings"]["auth"]["open_metrics"] == "loopback"  # type: ignore[index]
            status, said = await _admin(url, "POST", "/admin/reload", {"force": True})  # metrics opened, on purpose
            assert status == 200 and said["ok"] is True, said
            async with aiohttp.ClientSession() as s, s.get(f"{url}/config") as r:
                assert r.status == 401  # still an admin route
            assert (await _admin(url, "GET", "/config"))[1]["settings"]["auth"]["open_metrics"] == "always"  # type: ignore[index]


async def test_a_reload_applies_what_it_says_and_refuses_what_it_cannot(tmp_path: Path) -> None:
    """`state.on_unavailable: closed` by reload, then Redis killed: the limited caller is refused
    as a start with that file refuses it (503 `shared_state_unavailable`). A new `state.url` needs
    a restart: refused by name, and `/config` keeps showing the URL in force."""
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), redis_server(tmp_path) as redis, running_sim(engine(), time_scale=SCALE) as sim:
        base = yaml.safe_load(gateway_yaml(sim.url, 2, 4096))
        auth = {"api_keys": {KEY: {"name": "prod", "rpm_limit": 1000}}, "admin_keys": [ADMIN]}

        def write(**state: object) -> None:
            path.write_text(yaml.safe_dump({**base, "auth": auth, "state": {"url": redis.url, **state}}))
        write()
        async with serving(path) as (_, url):
            assert await _status(url, KEY) == 200
            shown = (await _admin(url, "GET", "/config"))[1]["settings"]["state"]  # type: ignore[index]
            write(url="redis://127.0.0.1:1")
            code, out = await tailguard("config", "reload", "-c", str(path))
            assert code == 1 and "need a restart" in out and "state.url" in out, out
            assert (await _admin(url, "GET", "/config"))[1]["settings"]["state"] == shown  # type: ignore[index]
            write(on_unavailable="closed")
            code, out = await tailguard("config", "reload", "-c", str(path))
            assert code == 0, out
            assert (await _admin(url, "GET", "/config"))[1]["settings"]["state"]["on_unavailable"] == "closed"  # type: ignore[index]
            await redis.kill()
            async with aiohttp.ClientSession() as s, s.post(
                    f"{url}/v1/chat/completions", data=CHAT,
                    headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}) as r:
                assert r.status == 503 and r.headers["X-Tailguard-Reject-Reason"] == "shared_state_unavailable"
