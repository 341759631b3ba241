"""`tailguard replay` as a user runs it, on a small recording of a real gateway (a batch stream
suspended for chats): identical without --config; with --config, the classes side by side and
the fit's agreement; a changed decision exits 1 naming its line; a broken file exits 2. And
`tailguard serve --record` into a folder that does not exist refuses at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.cli import run
from tests.functional.gateways import gateway
from tests.functional.test_gateway_preempt import BATCH, CHAT, PREEMPTIBLE


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay") / "front.jsonl"

    async def record() -> None:
        async with asyncio.timeout(60), gateway(max_concurrency=2, scale=0.05, record=path, classes=PREEMPTIBLE,
                                                scheduler={"min_run_s": 0.0}) as gw, gw.client() as c:
            batch = [asyncio.create_task(c.chat.completions.create(
                model="tailguard-sim", messages=CHAT, max_tokens=1500, extra_headers=BATCH)) for _ in range(2)]
            await asyncio.sleep(0.1)
            for _ in range(6):
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=16)
            await asyncio.gather(*batch)

    asyncio.run(record())
    return path


async def test_the_same_config_makes_the_same_decisions(recording: Path) -> None:
    code, out = await run("replay", str(recording))
    assert code == 0, out
    assert out.startswith(f"{recording}: ") and out.rstrip().endswith("decisions, identical")


async def test_another_config_shows_what_would_have_changed(recording: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("backends:\n  - {name: sim0, url: 'http://127.0.0.1:1', kind: sim, max_concurrency: 1}\n"
                     "classes:\n  - {name: interactive, rank: 0}\n  - {name: batch, rank: 1, preemptible: true}\n")
    code, out = await run("replay", str(recording), "--config", str(other), columns=120)
    assert code == 0, out
    assert "decisions, identical" in out
    assert "8 requests over" in out and "other.yaml changes: backends.max_concurrency: 2 -> 1" in out
    assert "engine fitted to the recording (h100-llama8b's shape): decode x" in out
    for word in ("recorded", "re-simulated", "other.yaml", "fit: re-sim/rec", "batch", "interactive", "queue P99",
                 "TTFT P50", "rejected", "preempted"):
        assert word in out, word
    assert "note: arrivals are replayed at their recorded instants" in out


async def test_a_changed_decision_exits_1_naming_its_line(recording: Path, tmp_path: Path) -> None:
    lines = recording.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if '"type":"Start"' in line)
    step = json.loads(lines[n])
    step["decisions"][0]["backend"] = "elsewhere"
    lines[n] = json.dumps(step)
    forged = tmp_path / "forged.jsonl"
    forged.write_text("\n".join(lines) + "\n")
    code, out = await run("replay", str(forged))
    assert code == 1, out
    assert f"first difference at line {n + 1}: Arrive(" in out and "backend='elsewhere'" in out


async def test_a_broken_file_exits_2_naming_its_line(recording: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text(recording.read_text().splitlines()[0] + '\n{"now": 1.0}\n')
    code, out = await run("replay", str(broken))
    assert code == 2 and "line 2: the line: missing field(s) decisions, event, preempt" in out, out


async def test_serve_refuses_a_recording_it_cannot_write_before_it_starts(tmp_path: Path) -> None:
    code, out = await run("serve", "--sim", "--record", str(tmp_path / "no-such-dir" / "front.jsonl"))
    assert code == 2 and out.startswith("error: --record ") and "No such file or directory" in out, out


async def test_a_missing_recording_says_which_file_and_what_to_give(tmp_path: Path) -> None:
    code, out = await run("replay", str(tmp_path / "none.jsonl"))
    assert code == 2 and "none.jsonl: No such file or directory" in out and "tailguard serve --record FILE" in out, out
