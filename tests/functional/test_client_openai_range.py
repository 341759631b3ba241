"""The client against both ends of the openai range pyproject.toml states: for each, a throwaway
venv gets that openai from PyPI (with the HTTP library it brings), sees everything else from this
venv, and runs the client's own tests there. Needs the network and about a minute: marked `sdk`,
run by `make test-sdk` and CI, not by `make test`."""

from __future__ import annotations

import re
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TESTS = ["tests/unit/client", "tests/functional/test_client_deadlines.py",
                "tests/functional/test_client_retries.py", "tests/functional/test_client_assembly.py",
                "tests/functional/test_client_gateway.py"]


def supported() -> tuple[str, str]:
    """The `openai>=LOW,<HIGH` of the light install's dependencies."""
    found = re.search(r'"openai>=([\d.]+),<([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert found is not None, "pyproject.toml states no openai range"
    return found.group(1), found.group(2)


def run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)


@pytest.mark.sdk
@pytest.mark.timeout(600)
@pytest.mark.parametrize("end", ["oldest", "newest"])
def test_the_client_works_with_both_ends_of_the_openai_range(end: str, tmp_path: Path) -> None:
    low, high = supported()
    pin = f"openai=={low}" if end == "oldest" else f"openai<{high}"
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    installed = run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", pin], 300)
    assert installed.returncode == 0, installed.stderr
    # Everything but the SDK and its own requirements from this venv: a .pth of the throwaway
    # venv adds this one's site-packages after its own, so its openai wins. Its second line makes
    # the SDK's one-time platform probe at start (`distro`, which older releases ask at the first
    # call, takes about a second on a busy machine and keeps its answer): the deadline tests time
    # the client, not that probe.
    own = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], 30).stdout.strip()
    (Path(own) / "zz_tailguard_env.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n"
        "import importlib.util as u; u.find_spec('distro') and __import__('distro').id()\n")
    version = run([python, "-c", "import openai; print(openai.__version__)"], 60).stdout.strip()
    if end == "oldest":
        assert version in (low, f"{low}.0"), version
    else:
        assert int(version.split(".")[0]) == int(high) - 1, version
    tests = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLIENT_TESTS], 400)
    assert tests.returncode == 0, f"openai {version}:\n{tests.stdout[-3000:]}"
