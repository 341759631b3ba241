"""`tailguard serve --workers 2` as a user runs it: two gateway processes on one port (SO_REUSEPORT),
each with half of every cap, both answering; SIGTERM to the parent stops both."""

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
CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


async def test_two_workers_share_the_port_and_halve_the_caps(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    async with asyncio.timeout(60), running_sim(engine(), time_scale=SCALE) as sim:
        path.write_text(yaml.safe_dump({"port": 0, "access_log": False, "backends": [
            {"name": "sim", "url": sim.url, "kind": "sim", "max_concurrency": 8}]}))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tailguard", "serve", "--config", str(path), "--workers", "2",
            stderr=asyncio.subprocess.PIPE, cwd=ROOT)
        try:
            assert proc.stderr is not None
            started: list[str] = []
            while len(started) < 2:  # each worker says where it listens
                line = (await proc.stderr.readline()).decode()
                assert line, "the gateway exited"
                if "listening on http://" in line:
                    started.append(line.split("http://", 1)[1].split()[0])
            assert started[0] == started[1]
            url = "http://" + started[0]
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
