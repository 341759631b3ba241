"""With the client alone installed (`pip install tailguard`), the `tailguard` command says in one
line that it needs `tailguard[full]`. The light install is made here by hiding one of the full
extra's packages from the interpreter (`sys.modules[name] = None` makes its import fail)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = "import sys; sys.modules[{name!r}] = None; sys.argv = {argv!r}\n" \
       "from tailguard.__main__ import main; main()"


@pytest.mark.parametrize("name,argv", [
    ("typer", ["tailguard", "--help"]),  # the command line itself
    ("aiohttp", ["tailguard", "sim", "--port", "0"]),  # a verb's own parts, imported when it runs
])
def test_the_command_without_the_full_install_says_what_to_install(name: str, argv: list[str]) -> None:
    code = CODE.format(name=name, argv=argv)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"tailguard: the command line needs the full install (no module {name!r}): pip install 'tailguard[full]'"]


def test_the_full_install_runs_the_command() -> None:
    r = subprocess.run([sys.executable, "-m", "tailguard", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("tailguard ")
