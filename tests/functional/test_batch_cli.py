"""`tailguard batch` against a real gateway: submit --wait follows the batch to its end, results
reads it back, retry of a batch with nothing failed says so, a wrong key is one error line."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

from tests.functional.batch_calls import input_file
from tests.functional.gateways import engine, gateway


async def tailguard(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tailguard", "batch", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_wait_results_retry_and_a_refusal(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(input_file(20))
    async with gateway(max_concurrency=16, engine_cfg=engine(), auth={"api_keys": {"k": {}}},
                       batches={"dir": str(tmp_path / "b"), "poll_s": 0.2}) as gw:
        common = ("--url", gw.url, "--api-key", "k")
        code, out, err = await tailguard("submit", str(path), "--wait", *common)
        assert code == 0, err
        batch_id = out.splitlines()[0]
        assert batch_id.startswith("batch_") and "completed  20 completed, 0 failed of 20" in out
        code, out, _ = await tailguard("results", batch_id, *common)
        assert code == 0 and sorted(orjson.loads(ln)["custom_id"] for ln in out.splitlines()) == [
            f"line-{i:05d}" for i in range(20)]
        code, _, err = await tailguard("retry", batch_id, *common)
        assert code == 1 and "no failed lines" in err
        code, _, err = await tailguard("cancel", batch_id, "--url", gw.url, "--api-key", "wrong")
        assert code == 1 and err.startswith("error: 401: Incorrect API key") and "Traceback" not in err


async def test_the_quick_form_says_how_to_turn_batches_on_and_does_with_a_state_dir(tmp_path: Path) -> None:
    """`tailguard serve --backend URL` keeps no files: a batch is a 404 that says what to give;
    with `--state-dir DIR` the same command serves batches."""
    from tailguard.sim.server import running_sim
    from tests.functional.test_gateway_cli import _start, _stop

    path = tmp_path / "in.jsonl"
    path.write_bytes(input_file(3))
    async with asyncio.timeout(60), running_sim(engine(), time_scale=0.02) as sim:
        proc, url = await _start("--backend", sim.url)
        try:
            code, _, err = await tailguard("submit", str(path), "--url", url)
            assert code == 1 and "404" in err and "--state-dir DIR" in err and "Traceback" not in err, err
        finally:
            await _stop(proc)
        proc, url = await _start("--backend", sim.url, "--state-dir", str(tmp_path / "state"))
        try:
            code, out, err = await tailguard("submit", str(path), "--wait", "--url", url)
            assert code == 0 and "3 completed, 0 failed of 3" in out, err
        finally:
            await _stop(proc)
