"""The README's "Using it" block, then its doctor and sweep block, run as a person pastes them: the
very commands, in order, in one bash with `set -euo pipefail` that starts with nothing of
tailguard's on PATH (as a new terminal) and has only the README's own set-up line to find it, so a
command that fails (or a background server that never comes up) fails the test. Only sizes
change: the ports become free ones, the venv's path is this one's, and the runs are shortened and
sped up by the same factor everywhere (requests, durations, time scale, rate)."""

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
VENV = Path(sys.executable).parent.parent  # the venv under test, where the README's `.venv` is
SETUP = "source .venv/bin/activate"
FRESH_PATH = "/usr/local/bin:/usr/bin:/bin"  # a new terminal's: no venv on it


def block(heading: str) -> str:
    """The first bash block under the README's `## heading`."""
    text = README.read_text()
    section = text[text.index(f"\n## {heading}"):]
    section = section[:section.index("\n## ", 1)]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found, f"README's {heading} has no bash block"
    return found.group(1)


def readme_script() -> str:
    """Using it, with the doctor and sweep block run before its last step stops the servers."""
    using_it, doctor = block("Using it"), block("When the tail is bad")
    assert SETUP in using_it.splitlines()[1], "Using it no longer starts with the set-up line"
    head, stop = using_it.split("\n# 6. ")
    return f"{head}\n{doctor}\n# 6. {stop}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shortened(script: str, engine: int, gateway: int) -> str:
    """The same commands with free ports, a 10x faster clock and fewer, shorter runs."""
    speedup = 10.0  # time scale 0.25 -> 0.025: the rate in wall seconds goes up by the same factor
    subs: list[tuple[str, str | Callable[[re.Match[str]], str]]] = [
        (re.escape(SETUP), f"source {VENV}/bin/activate"),
        (r"\b8000\b", str(engine)), (r"\b8080\b", str(gateway)),
        (r"--time-scale ([\d.]+)(?=\s)", lambda m: f"--time-scale {float(m.group(1)) / speedup:g}"),
        (r"--rate ([\d.]+)(?=\s)", lambda m: f"--rate {float(m.group(1)) * speedup:g}"),
        (r"--requests \d+", "--requests 24"), (r"--duration \d+", "--duration 1"), (r"--warmup \S+", "--warmup 0.25s"),
    ]
    for pattern, repl in subs:
        script, n = re.subn(pattern, repl, script)
        assert n, f"the README no longer has {pattern!r}: update this test's substitutions"
    return script


async def test_the_readme_runs_as_written_in_a_new_shell(tmp_path: Path) -> None:
    script = shortened(readme_script(), free_port(), free_port())
    assert "tailguard sim" in script and "tailguard serve" in script and "bench compare" in script
    assert "tailguard doctor" in script and "tailguard sweep" in script
    script = 'if command -v tailguard; then echo "tailguard is on PATH before the set-up line"; exit 3; fi\n' + script
    log = tmp_path / "out.log"
    with log.open("wb") as out:  # a file, not a pipe: servers left in the background hold no EOF back
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", "set -euo pipefail\n" + script, cwd=tmp_path, start_new_session=True, stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={"PATH": FRESH_PATH, "HOME": str(tmp_path), "LANG": "C.UTF-8", "COLUMNS": "120"})
        try:
            async with asyncio.timeout(150):
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
        assert summary["run"]["time_scale"] == 0.025 and summary["overall"]["ok"] == summary["overall"]["count"] > 0
    assert (tmp_path / "runs" / "after" / "compare.html").is_file() and "Verdict" in text
    # bench took the simulator's time scale and said so; the compare of no gateway with a gateway warns of nothing
    assert "announced time scale 0.025" in text and "gateway config: none (straight to the backend) -> " in text
    assert not [line for line in text.splitlines() if line.startswith("warning") and "gateway" in line], text
    # the gateway's log went to its file, not into the shell among bench's tables
    assert '"event":"access"' not in text.replace(" ", "")
    assert (tmp_path / "gateway.log").read_text().count('"event":"access"') >= 24
    assert (tmp_path / "runs" / "before" / "doctor.json").is_file()
    assert (tmp_path / "runs" / "sweep" / "sweep.json").is_file() and "recommended" in text
