"""The README's "Using it" block, run as a person pastes it: the very commands, in order, in one
bash with `set -euo pipefail`, so a command that fails (or a background server that never comes
up) fails the test. Only sizes change: the ports become free ones, and the runs are shortened
and sped up by the same factor everywhere (requests, durations, time scale, rate)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Callable

import orjson

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = str(Path(sys.executable).parent)


def using_it() -> str:
    text = README.read_text()
    section = text[text.index("\n## Using it\n"):]
    section = section[:section.index("\n## ", 1)]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's Using it has no bash block"
    return block.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shortened(script: str, engine: int, gateway: int) -> str:
    """The same commands with free ports, a 5x faster clock and fewer, shorter runs."""
    speedup = 5.0  # time scale 0.25 -> 0.05: the rate in wall seconds goes up by the same factor
    subs: list[tuple[str, str | Callable[[re.Match[str]], str]]] = [
        (r"\b8000\b", str(engine)), (r"\b8080\b", str(gateway)),
        (r"--time-scale (\S+)", lambda m: f"--time-scale {float(m.group(1)) / speedup:g}"),
        (r"--rate (\S+)", lambda m: f"--rate {float(m.group(1)) * speedup:g}"),
        (r"--requests \d+", "--requests 24"), (r"--duration \S+", "--duration 2"), (r"--warmup \S+", "--warmup 0.5s"),
    ]
    for pattern, repl in subs:
        script, n = re.subn(pattern, repl, script)
        assert n, f"the README no longer has {pattern!r}: update this test's substitutions"
    return script


async def test_the_readme_using_it_block_runs_as_written(tmp_path: Path) -> None:
    script = shortened(using_it(), free_port(), free_port())
    assert "tailguard sim" in script and "tailguard serve" in script and "bench compare" in script
    log = tmp_path / "out.log"
    with log.open("wb") as out:  # a file, not a pipe: servers left in the background hold no EOF back
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", "set -euo pipefail\n" + script, cwd=tmp_path, start_new_session=True, stdout=out,
            stderr=asyncio.subprocess.STDOUT, env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "COLUMNS": "120"})
        try:
            async with asyncio.timeout(100):
                await proc.wait()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever the script left running in the background
            except ProcessLookupError:
                pass
            if proc.returncode is None:
                await proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert '"object":"chat.completion"' in text.replace(" ", "")
    for run in ("before", "after", "open"):
        summary = orjson.loads((tmp_path / "runs" / run / "summary.json").read_bytes())
        assert summary["run"]["time_scale"] == 0.05 and summary["overall"]["ok"] == summary["overall"]["count"] > 0
    assert (tmp_path / "runs" / "after" / "compare.html").is_file() and "Verdict" in text
