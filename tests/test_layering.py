"""Import rules from the architecture (docs/architecture.md), checked on each module's own imports."""

from __future__ import annotations

import ast
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tailguard"

PURE = {
    "types", "errors", "wire.sse", "wire.openai", "wire.tokens", "wire.chunks",
    "sim.cost", "sim.kv", "sim.engine",
    "gateway.classes", "gateway.caps", "gateway.scheduler", "gateway.router", "gateway.backends",
    "gateway.config", "gateway.preemption", "gateway.resume", "gateway.kinds", "sim.des",
    "bench.workload", "bench.stats", "bench.dataset", "bench.recorder", "bench.compare", "bench.attribution",
    "client.retry", "client.timeouts",
}
IO_MODULES = ("asyncio", "aiohttp", "prometheus_client", "time", "socket", "uvloop", "httpx")
# part -> parts it must never import
FORBIDDEN_PARTS = {
    "gateway": ("tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli"),
    "bench": ("tailguard.gateway", "tailguard.client", "tailguard.cli", "tailguard.sim"),
    "sim": ("tailguard.bench", "tailguard.client", "tailguard.cli", "tailguard.gateway"),
    "client": ("tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.cli"),
    "wire": ("tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli"),
}
# sim/des.py replays the gateway's pure policies on virtual time: the one allowed crossing.
ALLOWED_CROSSINGS = {("sim.des", f"tailguard.gateway.{m}")
                     for m in ("scheduler", "preemption", "classes", "caps", "router", "backends")}


def modules() -> list[tuple[str, Path]]:
    out = []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).with_suffix("")
        name = ".".join(rel.parts)
        out.append((name.removesuffix(".__init__") if name != "__init__" else "", p))
    return out


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("name,path", modules(), ids=lambda v: str(v))
def test_module_respects_layering(name: str, path: Path) -> None:
    imported = imports_of(path)
    if name in PURE:
        bad = sorted(m for m in imported if m.split(".")[0] in IO_MODULES)
        assert not bad, f"pure module tailguard.{name} imports I/O modules {bad}"
    part = name.split(".")[0]
    for forbidden in FORBIDDEN_PARTS.get(part, ()):
        bad = sorted(m for m in imported if m.startswith(forbidden) and (name, m) not in ALLOWED_CROSSINGS)
        assert not bad, f"tailguard.{name} may not import {bad}"


def test_subpackage_inits_are_empty() -> None:
    for init in SRC.glob("*/__init__.py"):
        if init.parent.name in ("client", "cli"):
            continue
        assert init.read_text().strip() == "", f"{init} should stay empty so pure imports stay light"


def test_every_module_imports_alone() -> None:
    """Each module imports in a fresh interpreter with warnings as errors (aiohttp's circular-import test)."""
    names = [f"tailguard.{n}" if n else "tailguard" for n, _ in modules() if not n.endswith("__main__")]
    code = "import importlib, sys\nimportlib.import_module(sys.argv[1])\n"

    def check(n: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        return n, subprocess.run([sys.executable, "-W", "error", "-c", code, n], capture_output=True, text=True, timeout=60)

    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f"{n}:\n{r.stderr}" for n, r in pool.map(check, names) if r.returncode != 0]
    assert not failures, "modules that fail to import alone:\n" + "\n".join(failures)
