"""`tailguard demo` as a short run with its output sent to a file (`make demo > demo.txt`): no
line folded at 80 columns, and compare.html says its times are simulated and opens with the
terminal's headline table."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.cli import TAILGUARD


async def test_a_short_demo_into_a_file_keeps_its_lines_whole_and_its_page_says_simulated(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    log = tmp_path / "demo.txt"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            TAILGUARD, "demo", "--duration", "1.5", "--time-scale", "0.05", "--concurrency", "8",
            "--out", str(tmp_path / "demo"), stdout=out, stderr=asyncio.subprocess.STDOUT, env=env)
        try:
            async with asyncio.timeout(90):
                assert await proc.wait() == 0, log.read_text()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    lines = log.read_text().splitlines()
    head = [line for line in lines if line.startswith("tailguard demo: simulator")]
    assert head and head[0].endswith("figures are simulated seconds)"), lines[:3]  # one line, not folded at 80
    verdicts = [line for line in lines if " requests measured; " in line]
    assert len(verdicts) == 2 and all(len(line) > 80 for line in verdicts), verdicts
    page = (tmp_path / "demo" / "compare.html").read_text()
    assert "Times are in simulated seconds: the simulator ran at time scale 0.05" in page
    assert "<h2>Headline</h2>" in page and "chat TTFT P99" in page and "output tokens/s" in page
