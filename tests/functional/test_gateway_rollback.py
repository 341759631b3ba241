"""Baselines and rollback on a running gateway: a real `tailguard serve --config` process in front
of a real simulator, streams in flight through it, and `tailguard config` run as a user runs it.
Every stream completes, every response names the config that answered it, and a rollback
returns the gateway to its baseline in well under a second of the gateway's own time."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import yaml
from openai import AsyncOpenAI

from tailguard.sim.server import running_sim
from tests.functional.gateways import engine
from tests.functional.test_gateway_cli import _start as start_serve, _stop as stop_serve

CHAT = [{"role": "user", "content": "hello"}]
LONG_TOKENS = 4000  # about 6 s of wall time each (under the batch cap of 4096): in flight across both changes
SCALE = 0.25


def gateway_yaml(sim_url: str, max_concurrency: int, batch_cap: int, **extra: object) -> str:
    return yaml.safe_dump({
        "port": 0, "access_log": False, **extra,
        "classes": [{"name": "interactive", "rank": 0},
                    {"name": "batch", "rank": 1, "max_tokens_cap": batch_cap, "preemptible": True}],
        "backends": [{"name": "sim", "url": sim_url, "kind": "sim", "max_concurrency": max_concurrency}],
    })


@asynccontextmanager
async def serving(path: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    proc, url = await start_serve("--config", str(path))
    try:
        yield proc, url
    finally:
        await stop_serve(proc)


async def tailguard(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def health(url: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/health") as r:
        assert r.headers["X-Tailguard-Config"] == (await r.json())["config"]["hash"]
        body: dict[str, object] = await r.json()
        return body


async def config_of(url: str) -> tuple[str, object]:
    """The hash in the header of a fresh answer, and /health's config."""
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
        raw = await c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
    return raw.headers["x-tailguard-config"], (await health(url))["config"]


async def stream(url: str, tokens: int) -> tuple[str, int, str | None]:
    """A batch stream to its end: (its config header, content chunks, finish reason)."""
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
        raw = await c.chat.completions.with_raw_response.create(
            model="tailguard-sim", messages=CHAT, max_tokens=tokens, stream=True, extra_headers={"X-Tailguard-Class": "batch"})
        chunks, reason = 0, None
        async for ch in raw.parse():
            if ch.choices and ch.choices[0].delta.content:
                chunks += 1
            if ch.choices and ch.choices[0].finish_reason:
                reason = ch.choices[0].finish_reason
        return raw.headers["x-tailguard-config"], chunks, reason


async def test_reload_and_rollback_under_load_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(90), running_sim(engine(max_num_seqs=8), time_scale=SCALE) as sim:
        path.write_text(gateway_yaml(sim.url, 2, 4096))
        async with serving(path) as (_, url):
            base, cfg = await config_of(url)
            assert cfg == {"hash": base, "n": 1}
            assert await tailguard("config", "mark-good", "-c", str(path)) == (
                0, f"config 1 ({base}) is the known-good baseline\n")
            streams = [asyncio.create_task(stream(url, LONG_TOKENS)) for _ in range(4)]
            while (await health(url))["queued"] != 2:  # two run, two wait behind the cap of 2
                await asyncio.sleep(0.02)

            path.write_text(gateway_yaml(sim.url, 4, 2048))
            code, out = await tailguard("config", "reload", "-c", str(path))
            assert code == 0 and "config 2 " in out, out
            changed, cfg = await config_of(url)
            assert changed != base and cfg == {"hash": changed, "n": 2}
            h = await health(url)
            assert h["queued"] == 0  # the raised cap let the waiting streams in at once
            assert h["backends"]["sim"]["in_flight"] >= 4  # type: ignore[index]
            streams.append(asyncio.create_task(stream(url, LONG_TOKENS)))  # capped at 2048 now
            code, out = await tailguard("config", "diff", "good", "current", "-c", str(path))
            assert out.splitlines() == ["backends[sim].max_concurrency: 2 -> 4",
                                        "classes[batch].max_tokens_cap: 4096 -> 2048"]

            # The rollback lowers the cap from 4 to 2 below what is in flight: nothing is cancelled.
            assert (await health(url))["backends"]["sim"]["in_flight"] >= 3  # type: ignore[index]
            started = time.monotonic()
            code, out = await tailguard("config", "rollback", "-c", str(path))
            took_s = time.monotonic() - started
            assert code == 0 and f"config 1 ({base}) applied" in out, out
            assert float(re.search(r"in ([\d.]+) s", out).group(1)) < 1.0  # type: ignore[union-attr]
            assert took_s < 10  # the whole command, interpreter start-up included
            assert (await config_of(url))[0] == base

            results = await asyncio.gather(*streams)
            # Each request keeps the caps it arrived under, and its header names that config.
            assert [r[2] for r in results] == ["length"] * 5
            assert [r[1] for r in results] == [LONG_TOKENS] * 4 + [2048]
            assert [r[0] for r in results] == [base] * 4 + [changed]

            code, out = await tailguard("config", "list", "-c", str(path))
            lines = out.splitlines()
            assert len(lines) == 2 and lines[0].endswith("rollback to 1    * good") and "reload" in lines[1], out


async def test_a_change_that_needs_a_restart_is_refused_whole(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(gateway_yaml(sim.url, 2, 4096))
        async with serving(path) as (proc, url):
            base, _ = await config_of(url)
            async with aiohttp.ClientSession() as s, s.get(f"{url}/no-such-route") as r:
                assert r.status == 404 and r.headers["X-Tailguard-Config"] == base  # errors name it too
            path.write_text(gateway_yaml(sim.url, 3, 4096, max_body_bytes=2048))
            code, out = await tailguard("config", "reload", "-c", str(path))
            assert code == 1 and "need a restart" in out and "max_body_bytes: 4194304 -> 2048" in out, out
            assert (await config_of(url))[0] == base
            assert (await health(url))["backends"]["sim"]["max_concurrency"] == 2  # type: ignore[index]
            proc.send_signal(signal.SIGHUP)  # the same refusal by the signal alone: the gateway keeps serving
            assert (await config_of(url))[0] == base
        assert await tailguard("config", "rollback", "-c", str(path)) == (
            1, f"error: no baseline marked in {tmp_path / '.tailguard' / 'gw'} (tailguard config mark-good N)\n")


async def test_diff_of_two_files_needs_no_gateway(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(gateway_yaml("http://127.0.0.1:9", 2, 4096))
    b.write_text(gateway_yaml("http://127.0.0.1:9", 2, 4096, scheduler={"policy": "fcfs"}))
    async with asyncio.timeout(30):
        assert await tailguard("config", "diff", str(a), str(b)) == (0, "scheduler.policy: ranked-sjf -> fcfs\n")
        assert await tailguard("config", "diff", str(a), str(a)) == (0, "no setting differs\n")


async def test_diff_status_and_rollback_see_the_edited_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    c = ["-c", str(path)]
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(gateway_yaml(sim.url, 2, 4096))
        async with serving(path) as (_, url):
            base, _ = await config_of(url)
            assert (await tailguard("config", "mark-good", *c))[0] == 0
            path.write_text(commented(sim.url, 2048))  # edited (with the team's notes), not applied yet
            edited = (await tailguard("config", "status", *c))[1].splitlines()[2].split()[1]
            assert await tailguard("config", "diff", *c) == (0, (
                f"from the running config 1 ({base}) to the file {path}:\n"
                "classes[batch].max_tokens_cap: 4096 -> 2048\n"))
            code, out = await tailguard("config", "status", *c)
            assert code == 0 and out.splitlines()[:3] == [
                f"running   {base}  config 1", f"baseline  {base}  config 1", f"file      {edited}  {path}"]
            assert "the file differs from what runs" in out and edited != base

            assert (await tailguard("config", "reload", *c))[0] == 0
            code, out = await tailguard("config", "rollback", *c)
            assert code == 0 and f"config 1 ({base}) applied" in out, out
            assert f"warning: {path} still differs from config 1" in out
            assert "  classes[batch].max_tokens_cap: 4096 -> 2048\n" in out and "--write" in out

            edited_text = path.read_text()
            code, out = await tailguard("config", "rollback", "--write", *c)
            assert code == 0 and f"wrote config 1's settings into {path}, its comments and layout kept" in out, out
            assert "warning" not in out
            assert (tmp_path / "gw.yaml.bak").read_text() == edited_text
            assert path.read_text() == commented(sim.url, 4096)  # the one setting back, every note kept
            assert await tailguard("config", "diff", *c) == (
                0, f"from the running config 1 ({base}) to the file {path}:\nno setting differs\n")
            code, out = await tailguard("config", "status", *c)
            assert out.splitlines()[2].split()[1] == base and "differs" not in out
            # A file ruamel.yaml cannot read round trip (a key twice, which PyYAML lets pass): said, left alone.
            path.write_text(commented(sim.url, 2048) + "port: 0\n")
            code, out = await tailguard("config", "rollback", "--write", *c)
            assert code == 1 and f"config 1 runs now, but --write did not write it into {path}" in out, out
            assert "the file is unchanged" in out and path.read_text() == commented(sim.url, 2048) + "port: 0\n"
        code, out = await tailguard("config", "status", *c)
        assert out.splitlines()[0] == f"last run  {base}  config 1"


def commented(sim_url: str, batch_cap: int) -> str:
    """`gateway_yaml(sim_url, 2, batch_cap)` as a person keeps it: notes, flow and block style."""
    return f"""# The team's gateway: keep these notes.
port: 0
access_log: false

classes:
  - {{name: interactive, rank: 0}}
  - name: batch                # summaries and reports
    rank: 1
    max_tokens_cap: {batch_cap}       # lowered on Tuesday, see the incident
    preemptible: true
# one simulator for now
backends:
  - {{name: sim, url: '{sim_url}', kind: sim, max_concurrency: 2}}
"""


async def test_a_second_gateway_on_the_same_state_directory_is_refused(tmp_path: Path) -> None:
    """Two `serve --config` of one file would share its state directory: the second would take
    over the pid file, so reloads would go to it and, once it stopped, find none though the first
    still ran. The second is refused in one line naming the first's pid and `--state-dir`; with a
    directory of its own it starts, and reloads still reach the first."""
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(gateway_yaml(sim.url, 2, 4096))
        async with serving(path) as (first, url):
            code, out = await tailguard("serve", "--config", str(path), "--port", "0")
            assert code == 1, out
            assert out.strip().splitlines() == [
                f"error: a gateway (pid {first.pid}) already serves from the state directory "
                f"{tmp_path / '.tailguard' / 'gw'}: stop it first, or give this one a state directory of its own "
                "with --state-dir DIR"]
            second, _ = await start_serve("--config", str(path), "--state-dir", str(tmp_path / "other"))
            try:
                code, out = await tailguard("config", "reload", "-c", str(path))
                assert code == 0 and f"applied by pid {first.pid}" in out, out
            finally:
                assert await stop_serve(second) == 0
            code, out = await tailguard("config", "reload", "-c", str(path))
            assert code == 0 and f"applied by pid {first.pid}" in out, out
        third, _ = await start_serve("--config", str(path))  # the first has gone: its directory is free again
        assert await stop_serve(third) == 0
