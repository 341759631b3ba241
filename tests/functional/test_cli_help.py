"""`COLUMNS=80 tailguard <verb> --help`, for every verb the command has: every option name shown
whole, flags shown without a value placeholder, nothing wider than the terminal. The verbs and
their options are read from the command itself, so a new verb or option is checked too."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import typer

from tailguard import __version__, cli
from tests.cli import run

def verbs() -> Iterator[tuple[list[str], Any]]:
    cli._register()

    def walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(cli.app), [])


@pytest.mark.parametrize("path,command", list(verbs()), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
async def test_help_at_80_columns_shows_every_option_whole(path: list[str], command: Any) -> None:
    code, text = await run(*path, "--help")
    assert code == 0, text
    assert "…" not in text and "<bool>" not in text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    words = set(text.replace(",", " ").replace("/", " ").split())
    for param in command.params:
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("-"):
                assert name in words, f"{' '.join(path)}: {name} not shown whole in\n{text}"


async def test_version() -> None:
    assert await run("--version") == (0, f"tailguard {__version__}\n")


def test_make_help_lists_every_target_with_what_it_does() -> None:
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    phony = re.search(r"^\.PHONY: (.*)$", (root / "Makefile").read_text(), re.M)
    assert phony is not None
    out = subprocess.run(["make", "-s", "help"], cwd=root, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[1]: line.split(None, 2)[2] for line in out.stdout.splitlines() if line.strip()}
    assert set(listed) == set(phony.group(1).split()) and all(listed.values()), out.stdout
