"""`tailguard serve` as a user starts it: a real process on 127.0.0.1, in front of the built-in
simulator (`--sim`) or of a simulator given by URL, served to the openai package."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from tests.functional.gateways import engine
from tailguard.sim.server import running_sim

CHAT = [{"role": "user", "content": "hello"}]


async def _start(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve", "--port", "0", *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    while True:
        line = (await proc.stderr.readline()).decode()
        assert line, "tailguard serve exited before listening"
        m = re.search(r"gateway listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)


async def _stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    return await proc.wait()


async def test_serve_sim_answers_and_stops_on_sigterm() -> None:
    async with asyncio.timeout(60):
        proc, url = await _start("--sim", "--sim-time-scale", "0.05", "--max-concurrency", "2", "--policy", "fcfs")
        try:
            async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
                raw = await c.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=3)
            assert raw.headers["x-tailguard-backend"] == "sim"
            r = raw.parse()
            assert r.usage is not None and r.usage.completion_tokens == 3
            assert await _stop(proc) == 0
            assert proc.stderr is not None
            log = (await proc.stderr.read()).decode()
            # one JSON access-log line, without the prompt text
            assert '"outcome":"success"' in log and "hello" not in log
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_serve_quick_form_in_front_of_a_backend_url() -> None:
    async with asyncio.timeout(60), running_sim(engine(), time_scale=0.05) as sim:
        proc, url = await _start("--backend", sim.url, "--max-concurrency", "4")
        try:
            async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
                r = await c.completions.create(model="tailguard-sim", prompt="hi", max_tokens=2)
            assert r.choices[0].text == " tok tok"
        finally:
            assert await _stop(proc) == 0


@pytest.mark.parametrize("yaml_text,needle", [
    ("backends: [{name: a, url: 'ftp://x'}]\n", "must start with http"),
    ("clases: []\n", "unknown setting"),
    ("backends: []\n", "no backends"),
])
async def test_bad_config_exits_2_with_a_message(tmp_path: Path, yaml_text: str, needle: str) -> None:
    path = tmp_path / "tailguard.yaml"
    path.write_text(yaml_text)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve", "--config", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert needle in err.decode()


async def test_serve_without_a_backend_says_what_to_give() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"--config" in err and b"--backend" in err and b"--sim" in err


# `tailguard serve` in an install without one extra: the module that extra installs is blocked.
_WITHOUT = "import sys; sys.modules[{module!r}] = None; sys.argv = ['tailguard', 'serve', '--config', {path!r}]; " \
           "from tailguard.__main__ import main; main()"


@pytest.mark.parametrize("extra,module,setting,yaml_text", [
    ("redis", "redis", "state.url", "state: {url: 'redis://127.0.0.1:6399'}\n"),
    ("postgres", "psycopg", "batches.store", "batches: {store: 'postgresql://tg@127.0.0.1/tg'}\n"),
    ("otel", "opentelemetry", "telemetry.otlp_endpoint", "telemetry: {otlp_endpoint: 'http://127.0.0.1:4318/v1/traces'}\n"),
])
async def test_a_setting_whose_extra_is_missing_names_the_extra(tmp_path: Path, extra: str, module: str, setting: str,
                                                                 yaml_text: str) -> None:
    path = tmp_path / "tailguard.yaml"
    path.write_text("port: 0\nbackends: [{name: a, url: 'http://127.0.0.1:9'}]\n" + yaml_text)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WITHOUT.format(module=module, path=str(path)),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    text = err.decode()
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert f"  {setting}: needs the `{extra}` extra, which is not installed: pip install 'tailguard[{extra}]'" in text
