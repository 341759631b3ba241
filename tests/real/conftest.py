"""Fixtures that run the real engines set up by `make engines`: llama.cpp's llama-server and vLLM (CPU).

Every test here is marked `real` (deselected by `make test`, run by `make test-real`). Engines are
started as child processes on 127.0.0.1 and always stopped. vLLM takes tens of seconds to start, so one
instance serves the whole session; llama-server starts in well under a second, so tests that kill one
start their own.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

from tailguard.cli.experiment import free_port
from tests.real.processes import EngineProcess
from tests.real.stalls import STALL_S, LoopLag, machine_pressure

CACHE = Path(os.environ.get("TAILGUARD_CACHE", Path.home() / ".cache" / "tailguard"))
MANIFEST = CACHE / "engines.json"
REAL_TIMEOUT_S = 420  # covers the session's one vLLM start (~40-90 s on a loaded 2-core machine)
LLAMA_SLOTS = 4
LLAMA_SLOT_CTX = 2048
VLLM_MAX_MODEL_LEN = 16384  # room for requests that outlast a slow poll (long_request_tokens and more)
VLLM_MAX_NUM_SEQS = 8


@dataclass(frozen=True)
class Engines:
    llama_server: Path
    gguf_model: Path
    gguf_model_slow: Path
    vllm_python: Path
    hf_model: Path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if is_real(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(REAL_TIMEOUT_S))


LOOP_LAG = pytest.StashKey[LoopLag]()
STARTED = pytest.StashKey[list[EngineProcess]]()
STALLS = pytest.StashKey[list[str]]()  # on the config: every stall seen, for the session's summary


def is_real(item: pytest.Item) -> bool:
    return Path(__file__).parent in Path(str(item.path)).parents


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A real test that failed while its own process stood still for over `STALL_S` (the loop
    that runs both the gateway and the clients woke that late) runs once more: what it checks
    cannot hold across a stall of minutes (long requests end, read timeouts fire), and CI has
    shown such stalls where none happens here. The first failure, the stall's length and the
    stack the loop stood in are printed in the session's summary either way, so a stall that our
    code causes shows up as such instead of being rerun away in silence."""
    if not is_real(item):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    lag = item.stash.get(LOOP_LAG, None)
    if lag is not None and lag.stalled and any(r.failed for r in reports if r.when == "call"):
        failure = next(r for r in reports if r.when == "call" and r.failed)
        item.config.stash.setdefault(STALLS, []).append(
            f"{item.nodeid} failed during a stall and was run again; its failure:\n"
            f"{failure.longreprtext[-3000:]}")
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    stalls = config.stash.get(STALLS, [])
    if stalls:
        terminalreporter.section(f"event loop stalls over {STALL_S:g} s")
        for text in stalls:
            terminalreporter.write_line(text)


@pytest.fixture(autouse=True)
async def loop_lag(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Watch how late the test's event loop (which the in-process gateway shares) wakes up, for
    the failure report: a deadline that fired because the process stalled looks like a bug."""
    lag = LoopLag()
    request.node.stash[LOOP_LAG] = lag
    task = asyncio.create_task(lag.watch())
    try:
        yield
    finally:
        task.cancel()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None],
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing real test's report carries what CI alone can tell: the tail of each engine's log,
    how far the event loop lagged, and how starved the machine was."""
    report = yield
    lag = item.stash.get(LOOP_LAG, None)
    if call.when == "call" and lag is not None and lag.stalled:
        item.config.stash.setdefault(STALLS, []).append(f"{item.nodeid} ({report.outcome}): {lag.describe()}")
    if call.when == "call" and report.failed:
        for proc in engines_of(item):
            report.sections.append((f"{proc.name} log (last 40 lines)", proc.log_tail(40)))
        if lag is not None:
            report.sections.append(("event loop and CPU time", lag.describe()))
        report.sections.append(("machine", machine_pressure()))
    return report


def engines_of(item: pytest.Item) -> list[EngineProcess]:
    """The engines a test used: its engine fixtures and the ones it started itself."""
    found = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, EngineProcess)]
    started: list[EngineProcess] = item.stash.get(STARTED, [])
    found += started
    return list({id(p): p for p in found}.values())


def load_engines() -> Engines | str:
    """The paths `make engines` recorded, or why they cannot be used."""
    if not MANIFEST.exists():
        return f"real engines are not set up ({MANIFEST} missing): run `make engines` first"
    doc = json.loads(MANIFEST.read_text())
    missing = [f.name for f in fields(Engines) if f.name not in doc]
    if missing:
        return f"{MANIFEST} lacks {', '.join(missing)} (written by an older setup): run `make engines` again"
    engines = Engines(**{f.name: Path(doc[f.name]) for f in fields(Engines)})
    for name, path in vars(engines).items():
        if not path.exists():
            return f"{name} {path} from {MANIFEST} is gone: run `make engines` again"
    return engines


@pytest.fixture(scope="session")
def engines() -> Engines:
    found = load_engines()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def llama_process(engines: Engines, log_dir: Path, name: str, slots: int = LLAMA_SLOTS,
                  threads: int = 1, slow: bool = False, metrics: bool = True) -> EngineProcess:
    port = free_port()
    model = engines.gguf_model_slow if slow else engines.gguf_model
    argv = [
        str(engines.llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(slots), "-c", str(slots * LLAMA_SLOT_CTX), "--slots", "-t", str(threads),
        "--no-webui", "-a", "tiny", "-n", "512",
    ] + (["--metrics"] if metrics else [])
    return EngineProcess(name=name, kind="llamacpp", argv=argv, port=port, log_path=log_dir / f"{name}-{port}.log")


def vllm_process(engines: Engines, log_dir: Path) -> EngineProcess:
    port = free_port()
    argv = [
        str(engines.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(engines.hf_model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(VLLM_MAX_MODEL_LEN), "--max-num-seqs", str(VLLM_MAX_NUM_SEQS),
        "--dtype", "float32", "--enforce-eager", "--scheduling-policy", "priority",
        # For tool calls through the gateway (a named tool_choice needs a parser in vLLM 0.32).
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    # 2 GiB of KV is 65,536 tokens: twelve running requests of long_request_tokens never run out
    # of KV (vLLM preempts nothing on its own).
    return EngineProcess(name="vllm", kind="vllm", argv=argv, port=port, log_path=log_dir / f"vllm-{port}.log", env=env,
                         long_request_tokens=4000)  # the batch class's cap is 4096


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="session")
def llama_server(engines: Engines, engine_logs: Path) -> Iterator[EngineProcess]:
    """One llama-server with 4 slots for the whole session."""
    proc = llama_process(engines, engine_logs, "llama")
    try:
        proc.start(ready_timeout_s=60)
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def start_llama(engines: Engines, engine_logs: Path,
                request: pytest.FixtureRequest) -> Iterator[Callable[..., EngineProcess]]:
    """Start extra llama-servers for one test (e.g. to kill one); all are stopped after it."""
    started: list[EngineProcess] = []
    request.node.stash[STARTED] = started

    def start(name: str = "llama-extra", slots: int = LLAMA_SLOTS, threads: int = 1, slow: bool = False,
              metrics: bool = True) -> EngineProcess:
        proc = llama_process(engines, engine_logs, name, slots=slots, threads=threads, slow=slow, metrics=metrics)
        started.append(proc)
        proc.start(ready_timeout_s=60)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture(scope="session")
def vllm_server(engines: Engines, engine_logs: Path) -> Iterator[EngineProcess]:
    """One vLLM (CPU) for the whole session, under `--scheduling-policy priority`."""
    proc = vllm_process(engines, engine_logs)
    try:
        proc.start(ready_timeout_s=360)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(params=["llamacpp", "vllm"])
def engine(request: pytest.FixtureRequest) -> EngineProcess:
    """Each engine in turn, for behaviour both must show."""
    fixture = {"llamacpp": "llama_server", "vllm": "vllm_server"}[request.param]
    proc: EngineProcess = request.getfixturevalue(fixture)
    return proc
