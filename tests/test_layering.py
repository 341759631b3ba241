"""Import rules from the architecture (docs/architecture.md), checked on each module's own imports."""

from __future__ import annotations

import ast
import re
import subprocess
from importlib import metadata
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tailguard"

PURE = {
    "types", "errors", "settings", "retry_budget", "slo", "wire.sse", "wire.openai", "wire.tokens", "wire.chunks", "wire.join",
    "sim.cost", "sim.kv", "sim.engine", "sim.request", "sim.answer", "sim.fault",
    "front.params", "front.admission", "front.queue", "front.slots", "front.router", "front.preemption", "front.retry", "front.events", "front.front",
    "front.fairshare", "front.fairqueue", "front.schedulers", "front.plas", "front.programs", "front.identity",
    "front.order", "front.latency",
    "front.intake", "recording.codec", "recording.replay", "front.adaptive", "sim.fit", "gateway.classes", "gateway.upstream.backends",
    "config", "gateway.ops.live", "gateway.ops.catalog", "front.capacity",
    "gateway.ops.panels", "gateway.ops.alerts", "gateway.upstream.resume", "gateway.upstream.kinds", "sim.des", "sim.scenario", "sim.carrier", "sim.fleet", "sim.agenda", "sim.live",
    "config.base", "config.classes", "config.backends", "config.scheduler",
    "config.upstream", "config.auth", "config.telemetry", "config.gateway", "config.problems",
    "config.loading", "config.workers", "config.state", "config.rewrite", "config.programs",
    "bench.workload", "bench.agents", "sweep.agents", "bench.stats", "bench.capacity", "bench.dataset", "bench.recorder", "bench.compare", "bench.configs", "bench.attribution",
    "bench.trace.request", "bench.trace.tables", "bench.trace.jsonl", "bench.trace.formats", "bench.trace.timing",
    "bench.trace.rules", "bench.trace.blocks", "bench.trace.plan", "bench.validity",
    "doctor.finding", "doctor.evidence", "doctor.facts", "doctor.rules", "doctor.diagnosis", "sweep.virtual", "sweep.search",
    "doctor.hardware", "doctor.pages", "doctor.hardware_rules", "doctor.priority", "doctor.words", "wire.dcgm", "sim.gpu",
    "sweep.traffic", "sweep.whatif", "sweep.caps",
    "retry_policy", "client.retry", "client.timeouts", "client.chunks", "client.assembly",
    "batch.records", "batch.validation", "batch.journal", "config.batches",
    "config.guards", "config.audit", "guards.patterns", "guards.texts", "guards.window", "audit.chain",
}
IO_MODULES = ("asyncio", "aiohttp", "prometheus_client", "time", "socket", "uvloop", "httpx", "httpx2", "anyio")
# part -> parts it must never import
FORBIDDEN_PARTS = {
    # The front decides for every driver: it knows no gateway, simulator, bench or HTTP.
    "front": ("tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli",
              "tailguard.sweep", "tailguard.doctor"),
    "gateway": ("tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli"),
    "bench": ("tailguard.gateway", "tailguard.client", "tailguard.cli", "tailguard.sim"),
    "sim": ("tailguard.bench", "tailguard.client", "tailguard.cli", "tailguard.gateway"),
    "client": ("tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.cli"),
    "wire": ("tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli"),
    # doctor reads bench runs and the servers' pages; it never runs or imports a server
    "doctor": ("tailguard.gateway", "tailguard.sim", "tailguard.client", "tailguard.cli", "tailguard.sweep"),
    # batch jobs run through the gateway's own front; they know no simulator, bench or client
    "batch": ("tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli", "tailguard.gateway.http"),
    # sweep drives the simulator on virtual time and measures with bench's statistics; processes live in cli/
    "sweep": ("tailguard.client", "tailguard.cli"),
    # the product's settings, read by every part that runs one: it knows none of them
    "config": ("tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli",
               "tailguard.sweep", "tailguard.doctor", "tailguard.batch", "tailguard.recording"),
    # a front's conversation written down and replayed: it knows the front, no driver of it
    "recording": ("tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.client", "tailguard.cli",
                  "tailguard.sweep", "tailguard.doctor", "tailguard.batch"),
    # content guards: the gateway calls them; they know the config and the wire, no driver or server
    "guards": ("tailguard.gateway", "tailguard.front", "tailguard.sim", "tailguard.bench", "tailguard.client",
               "tailguard.cli", "tailguard.sweep", "tailguard.doctor", "tailguard.batch", "tailguard.audit"),
    # the audit trail and its stores: the gateway (gateway/ops/audit.py) and `tailguard audit` use it
    "audit": ("tailguard.gateway", "tailguard.front", "tailguard.sim", "tailguard.bench", "tailguard.client",
              "tailguard.cli", "tailguard.sweep", "tailguard.doctor", "tailguard.batch", "tailguard.guards"),
    # a leaf both the front and the light client import: it imports no part
    "retry_policy": ("tailguard.front", "tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.client",
                     "tailguard.cli", "tailguard.wire", "tailguard.doctor", "tailguard.sweep", "tailguard.batch"),
    "retry_budget": ("tailguard.front", "tailguard.gateway", "tailguard.sim", "tailguard.bench", "tailguard.client",
                     "tailguard.cli", "tailguard.wire", "tailguard.doctor", "tailguard.sweep"),
}
# No part crosses into another's: the gateway and the simulator share the front instead.
ALLOWED_CROSSINGS: set[tuple[str, str]] = set()
# Within the gateway, by side (module prefix -> what it must never import). The request's core
# (dispatch, exchange, request, sink) and the upstream side know nothing of the client's HTTP side;
# the operations side (metrics, logs, state) knows neither side it observes. Only the composers see
# every side: http/app.py builds a gateway, ops/reload.py swaps its parts.
_GW = "tailguard.gateway."
GATEWAY_SIDES = {
    "gateway.upstream.": (_GW + "http", _GW + "exchange", _GW + "ops.reload", _GW + "ops.store"),
    "gateway.dispatch": (_GW + "http", _GW + "exchange", _GW + "ops.reload", _GW + "ops.store"),
    "gateway.exchange": (_GW + "http", _GW + "ops.reload", _GW + "ops.store"),
    "gateway.request": (_GW + "http", _GW + "ops", _GW + "exchange", _GW + "dispatch", _GW + "line"),
    "gateway.line": (_GW + "http", _GW + "ops", _GW + "exchange", _GW + "dispatch", _GW + "lifecycle"),
    "gateway.lifecycle": (_GW + "http", _GW + "ops.reload", _GW + "ops.store"),
    "gateway.classes": (_GW + "http", _GW + "ops", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.rejection": (_GW + "http", _GW + "ops", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.sink": (_GW + "http", _GW + "ops", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.metrics": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.histograms": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.headers": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.access": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.log_buffer": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.live": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.store": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.recorder": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.ops.audit": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "dispatch"),
    "gateway.shared.": (_GW + "http", _GW + "upstream", _GW + "exchange", _GW + "ops.reload", _GW + "ops.store"),
}


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
        bad = sorted(m for m in imported if (m == forbidden or m.startswith(forbidden + "."))
                     and (name, m) not in ALLOWED_CROSSINGS)
        assert not bad, f"tailguard.{name} may not import {bad}"


@pytest.mark.parametrize("name,path", [(n, p) for n, p in modules() if n.startswith("gateway.")], ids=lambda v: str(v))
def test_gateway_module_respects_its_side(name: str, path: Path) -> None:
    imported = imports_of(path)
    for prefix, forbidden in GATEWAY_SIDES.items():
        if name == prefix or name.startswith(prefix) and prefix.endswith("."):
            bad = sorted(m for m in imported for f in forbidden if m == f or m.startswith(f + "."))
            assert not bad, f"tailguard.{name} may not import {bad} (docs/architecture.md, Layout)"


# The gateway's one clock is chosen where the gateway is composed and handed to every part that
# reads the time; no other module reads it for itself (tests hand the parts a clock of their own).
CLOCK_COMPOSERS = {"gateway.http.app"}


def test_only_the_composer_reads_the_gateways_clock() -> None:
    readers = []
    for name, path in modules():
        if not name.startswith("gateway.") or name in CLOCK_COMPOSERS:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "tailguard.clock" and any(
                    a.name == "monotonic" for a in node.names):
                readers.append(name)
            elif isinstance(node, ast.Attribute) and node.attr in ("perf_counter", "monotonic") and isinstance(
                    node.value, ast.Name) and node.value.id == "time":
                readers.append(name)
            elif isinstance(node, ast.Attribute) and node.attr == "time" and isinstance(node.value, ast.Name) \
                    and node.value.id == "loop":
                readers.append(name)
    assert not readers, f"read a clock of their own instead of the one they are given: {sorted(set(readers))}"


def test_subpackage_inits_are_empty() -> None:
    for init in [*SRC.glob("*/__init__.py"), *SRC.glob("gateway/*/__init__.py")]:
        if init.parent.name in ("client", "cli", "config"):  # public APIs re-exported (config: its models)
            continue
        assert init.read_text().strip() == "", f"{init} should stay empty so pure imports stay light"


# One interpreter imports the libraries outside the package once, then forks a child per module of
# the package, which imports that module and nothing of the package before it. The package's own
# import order is what this checks (a cycle that only works from one entry point, a module that
# leans on another having been imported first), and each child starts from none of it, as a fresh
# interpreter would; the libraries' own imports are not ours to check, and importing them ~190
# times was most of this test's time (99 s of the unit tests' 220 on a 2-core machine).
_IMPORT_ALONE = """
import importlib, os, sys, traceback
for dep in sys.argv[2:]:
    try:
        importlib.import_module(dep)
    except ImportError:
        pass  # an optional library: a module that needs it at import fails below, as alone
assert not [m for m in sys.modules if m == "tailguard" or m.startswith("tailguard.")]
failed = []
for name in sys.argv[1].split(","):
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            sys.stderr.write(f"{name}:\\n{traceback.format_exc()}\\n")
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        failed.append(name)
print(",".join(failed))
"""


def _libraries() -> list[str]:
    """The top-level names the package imports from outside itself (the standard library too)."""
    tops = {m.split(".")[0] for _, path in modules() for m in imports_of(path)}
    return sorted(t for t in tops if t != "tailguard" and t != "__future__")


def test_every_module_imports_alone() -> None:
    """Each module imports with no other module of the package imported before it, warnings as
    errors (aiohttp's circular-import test, in forked children of one interpreter: above)."""
    names = [f"tailguard.{n}" if n else "tailguard" for n, _ in modules() if not n.endswith("__main__")]
    done = subprocess.run([sys.executable, "-W", "error", "-c", _IMPORT_ALONE, ",".join(names), *_libraries()],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    failed = [n for n in done.stdout.strip().split(",") if n]
    assert not failed, f"modules that fail to import alone: {failed}\n{done.stderr}"


def _closure(dists: set[str]) -> set[str]:
    """The distributions `dists` need at run time (their `Requires-Dist` without extras), themselves included."""
    seen: set[str] = set()
    todo = list(dists)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:  # needed only on another platform: not installed here
            continue
        for req in reqs:
            if "extra ==" not in req:
                todo.append(re.match(r"[A-Za-z0-9._-]+", req).group(0))  # type: ignore[union-attr]
    return seen


_LIGHT_INSTALL = """
import importlib.abc, sys
allowed = set(sys.argv[1].split(","))

class OnlyAllowed(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in allowed and not top.startswith("_sysconfigdata"):  # the stdlib's build data
            raise ModuleNotFoundError(f"not installed with the client: {name}", name=name)
        return None

sys.meta_path.insert(0, OnlyAllowed())
import tailguard.client
tailguard.client.openai_client(base_url="http://127.0.0.1:9/v1", api_key="k").close()
tailguard.client.async_openai_client(base_url="http://127.0.0.1:9/v1", api_key="k")
print(*sorted(sys.modules))
"""


def test_client_pulls_in_only_the_stdlib_httpx2_and_openai() -> None:
    """An application that embeds tailguard.client needs none of the server or bench dependencies
    (aiohttp, numpy, matplotlib, prometheus_client, orjson, ...). A fresh interpreter in which
    only the standard library, tailguard, openai and httpx2 and their own requirements can be
    imported (as after `pip install tailguard` without extras) imports the client and builds
    both clients; nothing else of tailguard's is loaded. (openai imports aiohttp when it happens
    to be installed, as it is here; the finder makes that import fail as it would there.)"""
    by_module = metadata.packages_distributions()
    needed = _closure({"openai", "httpx2"})
    allowed = set(sys.stdlib_module_names) | {"tailguard", "__main__"} | {
        top for top, dists in by_module.items() if any(d.lower().replace("_", "-") in needed for d in dists)}
    run = subprocess.run([sys.executable, "-W", "error", "-c", _LIGHT_INSTALL, ",".join(sorted(allowed))],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    loaded = run.stdout.split()
    foreign = sorted({m.split(".")[0] for m in loaded} - allowed)
    assert not [f for f in foreign if not f.startswith(("_sysconfigdata", "_distutils_hack"))], foreign
    parts = sorted(m for m in loaded if m.startswith("tailguard.")
                   and not m.startswith(("tailguard.client", "tailguard.wire", "tailguard.retry_budget", "tailguard.retry_policy")))
    assert not parts, f"tailguard.client pulls in other parts: {parts}"
    assert "tailguard.wire.openai" not in loaded and "tailguard.wire.chunks" not in loaded  # orjson
