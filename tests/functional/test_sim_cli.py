"""`tailguard sim` as a user starts it: a real process on 127.0.0.1, served to the openai package."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

from openai import AsyncOpenAI


async def test_tailguard_sim_serves_the_openai_client_and_stops_on_sigterm() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "sim", "--port", "0", "--preset", "cpu-tiny", "--time-scale", "0.05",
        "--max-num-seqs", "2", "--scheduling-policy", "priority",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            assert proc.stderr is not None
            line = (await proc.stderr.readline()).decode()
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            assert m, line
            assert "max_num_seqs=2" in line and "policy=priority" in line
            async with AsyncOpenAI(base_url=f"{m.group(1)}/v1", api_key="x", max_retries=0) as c:
                r = await c.chat.completions.create(
                    model="tailguard-sim", messages=[{"role": "user", "content": "hello"}], max_tokens=3,
                    extra_body={"priority": 1})
            assert r.usage is not None and r.usage.completion_tokens == 3
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_bad_flag_values_exit_with_a_message() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "sim", "--preset", "tpu-9000",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"unknown engine preset 'tpu-9000'" in err and b"h100-llama8b" in err
