"""`tailguard serve`'s stderr as an operator's log shipper reads it: every line one JSON object
with a timestamp, a level and an event name (start with the config's hash and the backends, the
access lines, a 404's too, stop); or, with `log_format: text`, plain lines for a terminal."""

from __future__ import annotations

import asyncio
import signal
import sys
from datetime import datetime
from pathlib import Path

import aiohttp
import orjson

from tailguard.sim.server import running_sim
from tests.functional.gateways import engine

BODY = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def _serve_and_stop(config: Path | None, *args: str, wait_for: str = "gateway listening on ") -> list[str]:
    """Start `tailguard serve --config` (or with `args`), send a chat and a 404 once it listens and
    has said `wait_for`, stop it; its stderr lines."""
    argv = ["--config", str(config)] if config is not None else []
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tailguard", "serve", *argv, *args,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        lines = []
        url = None
        while url is None or not any(wait_for in line for line in lines):
            line = (await proc.stderr.readline()).decode()
            assert line, "tailguard serve exited before listening"
            lines.append(line)
            if "gateway listening on " in line:
                url = line.split("gateway listening on ")[1].split(" ")[0]
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/v1/chat/completions", json=BODY) as r:
                assert r.status == 200
            async with s.get(f"{url}/nope") as r:
                assert r.status == 404
        proc.send_signal(signal.SIGTERM)
        rest = await proc.stderr.read()
        assert await proc.wait() == 0
        return lines + rest.decode().splitlines()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_every_line_is_json_with_a_time_a_level_and_an_event(tmp_path: Path) -> None:
    async with asyncio.timeout(60), running_sim(engine(), time_scale=0.05) as sim:
        config = tmp_path / "tailguard.yaml"
        config.write_text(f"port: 0\nbackends: [{{name: sim, url: '{sim.url}', kind: sim}}]\n")
        lines = await _serve_and_stop(config)
    records = [orjson.loads(line) for line in lines if line.strip()]
    for r in records:
        assert datetime.fromisoformat(r["ts"]).tzinfo is not None and r["level"] and r["event"], r
    events = [r["event"] for r in records]
    # The access lines are written together every 0.2 s: the last ones may follow the stop line.
    assert events[0] == "start" and events.count("stop") == 1 and events.count("access") == 2
    start = records[0]
    assert start["config"]["hash"] and start["auth"] is False
    assert start["backends"] == [{"name": "sim", "url": sim.url, "kind": "sim", "max_concurrency": 8}]
    assert sorted(r["status"] for r in records if r["event"] == "access") == [200, 404]


async def test_log_format_text_is_for_a_terminal(tmp_path: Path) -> None:
    async with asyncio.timeout(60), running_sim(engine(), time_scale=0.05) as sim:
        config = tmp_path / "tailguard.yaml"
        config.write_text(f"port: 0\nlog_format: text\nbackends: [{{name: sim, url: '{sim.url}', kind: sim}}]\n")
        lines = await _serve_and_stop(config)
    own = [line for line in lines if not line.startswith("{")]  # access lines stay JSON
    assert own[0].split(" ")[1:3] == ["INFO", "start"] and "gateway listening on" in own[0]
    assert any(line.split(" ")[1:3] == ["INFO", "stop"] for line in own)


async def test_the_flags_set_the_log_and_a_clean_start_warns_of_nothing() -> None:
    """The quick form, as the README's story starts it: `--log-format text --no-access-log` keep a
    terminal readable without a config file, and a backend whose kind is found and which answers
    is said at `info` (a warning is for what needs a look)."""
    async with asyncio.timeout(60), running_sim(engine(), time_scale=0.05) as sim:
        lines = await _serve_and_stop(None, "--backend", sim.url, "--port", "0", "--log-format", "text",
                                      "--no-access-log", wait_for="reachable, kind sim (detected)")
    assert lines and not [line for line in lines if line.startswith("{")], lines  # no access line, no JSON
    levels = [line.split(" ")[1] for line in lines if line.strip()]
    assert set(levels) == {"INFO"}, lines
    assert any("backend" in line and "(detected)" in line for line in lines)


async def test_a_bad_log_format_is_one_line() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve", "--backend", "http://127.0.0.1:9", "--log-format", "yaml",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2 and err.decode().strip() == "error: --log-format 'yaml': known formats are json, text"
