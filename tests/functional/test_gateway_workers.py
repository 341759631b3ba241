"""`tailguard serve --workers 2` as a user runs it: two gateway processes on one port (SO_REUSEPORT),
each with half of every cap, both answering; SIGTERM to the parent stops both, and so does Ctrl-C,
which a terminal sends to every process of the group."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import orjson
import yaml

from tailguard.sim.server import running_sim
from tests.functional.gateways import SCALE, engine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAT = orjson.dumps({"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


async def _serve(path: Path, sim_url: str) -> tuple[asyncio.subprocess.Process, str]:
    """`tailguard serve --workers 2` in a process group of its own, as a shell starts it, once both
    workers say where they listen."""
    path.write_text(yaml.safe_dump({"port": 0, "access_log": False, "backends": [
        {"name": "sim", "url": sim_url, "kind": "sim", "max_concurrency": 8}]}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve", "--config", str(path), "--workers", "2",
        stderr=asyncio.subprocess.PIPE, cwd=ROOT, start_new_session=True)
    assert proc.stderr is not None
    started: list[str] = []
    try:
        while len(started) < 2:  # each worker says where it listens
            line = (await proc.stderr.readline()).decode()
            assert line, "the gateway exited"
            if "listening on http://" in line:
                started.append(line.split("http://", 1)[1].split()[0])
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    assert started[0] == started[1]
    return proc, "http://" + started[0]


async def test_two_workers_share_the_port_and_halve_the_caps(tmp_path: Path) -> None:
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        proc, url = await _serve(tmp_path / "gw.yaml", sim.url)
        try:
            prefixes = set()
            caps = set()
            for _ in range(24):  # a new connection each time: the kernel picks a worker per connection
                async with aiohttp.ClientSession() as s:
                    async with s.post(f"{url}/v1/chat/completions", data=CHAT,
                                      headers={"Content-Type": "application/json"}) as r:
                        assert r.status == 200
                        prefixes.add(r.headers["x-request-id"].rsplit("-", 1)[0])  # tg-<pid>-<salt>
                    async with s.get(f"{url}/health") as r:
                        caps.add((await r.json())["backends"]["sim"]["max_concurrency"])
            assert len(prefixes) == 2 and caps == {4}
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0


async def test_ctrl_c_stops_every_worker_once_and_cleanly(tmp_path: Path) -> None:
    """The terminal's SIGINT reaches the parent and both workers; the parent's own forward must not
    hit a worker a second time as it drains (which ended it by KeyboardInterrupt, a traceback)."""
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        proc, _ = await _serve(tmp_path / "gw.yaml", sim.url)
        assert proc.stderr is not None
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rest = (await asyncio.wait_for(proc.stderr.read(), 15)).decode()
            code = await asyncio.wait_for(proc.wait(), 15)
        finally:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    assert code == 0, rest
