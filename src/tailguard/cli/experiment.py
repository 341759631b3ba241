"""The seed experiment, composed from running parts: a simulator, optionally the gateway in front
of it, and the load generator. `tailguard demo` and the benchmarks in `benchmarks/` run it.

Each server runs in its own process (`python -m tailguard sim|serve`), as users run them, so the
load generator's event loop does not share a CPU slice with the servers it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Sequence

import aiohttp
import yaml


def free_port() -> int:
    """An ephemeral loopback port that is free now (the OS may hand it out again later; fine for a run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Poll `url` until it answers 200; fail early if the process died."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before it was healthy")
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} not healthy after {timeout_s:.0f} s")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """TERM, then KILL after a grace period: a run never leaves a server behind."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@contextlib.asynccontextmanager
async def spawned(
    args: Sequence[str], health_url: str, log_path: Path, env: Mapping[str, str] | None = None,
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """Run `python -m tailguard <args>` until the block ends; its output goes to `log_path`.
    `env` adds variables (e.g. a `PYTHONPATH` that runs another revision's source)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tailguard", *args], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        try:
            await wait_healthy(health_url, proc)
            yield proc
        finally:
            stop_process(proc)


@dataclass(frozen=True)
class SimSpec:
    """The simulated engine every arm of the experiment runs against."""

    preset: str = "h100-llama8b"
    max_num_seqs: int = 8
    time_scale: float = 0.25
    extra: tuple[str, ...] = ()

    def args(self, port: int) -> list[str]:
        return ["sim", "--port", str(port), "--preset", self.preset, "--max-num-seqs", str(self.max_num_seqs),
                "--time-scale", str(self.time_scale), *self.extra]


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: straight to the engine, or through the gateway with a policy."""

    label: str
    gateway: bool = False
    policy: str = "ranked-sjf"
    max_concurrency: int = 8
    config: dict[str, Any] | None = None  # gateway YAML settings (backends are filled in)
    record: Path | None = None  # the gateway's `--record FILE` (a gateway arm only)

    @property
    def folder(self) -> str:
        """The label as one path component (labels like `ranked-sjf@0.875/0.75` hold a slash)."""
        return re.sub(r"[^A-Za-z0-9_.@-]", "_", self.label)


@contextlib.asynccontextmanager
async def target(arm: Arm, sim: SimSpec, logs: Path) -> AsyncIterator[str]:
    """A fresh simulator (and gateway, for a gateway arm); yields the URL the load goes to."""
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    async with spawned(sim.args(sim_port), f"{sim_url}/health", logs / f"{arm.folder}-sim.log"):
        if not arm.gateway:
            yield sim_url
            return
        gw_port = free_port()
        gw_url = f"http://127.0.0.1:{gw_port}"
        args = ["serve", "--port", str(gw_port), "--policy", arm.policy]
        if arm.record is not None:
            arm.record.parent.mkdir(parents=True, exist_ok=True)
            args += ["--record", str(arm.record)]
        if arm.config is None:
            args += ["--backend", sim_url, "--backend-kind", "sim", "--max-concurrency", str(arm.max_concurrency)]
        else:
            path = logs / f"{arm.folder}-gateway.yaml"
            backend = {"name": "sim", "url": sim_url, "kind": "sim", "max_concurrency": arm.max_concurrency}
            path.write_text(yaml.safe_dump({**arm.config, "backends": [backend]}))
            args += ["--config", str(path)]
        async with spawned(args, f"{gw_url}/health", logs / f"{arm.folder}-gateway.log"):
            yield gw_url


async def run_arms(arms: Sequence[Arm], sim: SimSpec, load: dict[str, Any], out_dir: Path,
                   console: Any | None = None, tables: bool = True) -> dict[str, dict[str, Any]]:
    """Run the same seeded load against each arm in turn; returns each arm's summary by label
    (`tables=False`: progress only on `console`, not each arm's summary tables).

    `load` holds `BenchConfig` fields (rates and durations in wall seconds); recorded times are
    converted to simulated seconds, so every figure reads as the modelled GPU would deliver it."""
    from tailguard.bench.load import BenchConfig
    from tailguard.bench.report import bench_to_dir

    summaries: dict[str, dict[str, Any]] = {}
    for arm in arms:
        if console is not None:
            where = f"through the gateway ({arm.policy}, max_concurrency {arm.max_concurrency})" if arm.gateway \
                else "straight to the engine"
            console.rule(f"[bold]{arm.label}[/]: {load.get('workload')} {where}")
        async with target(arm, sim, out_dir / "logs") as url:
            cfg = BenchConfig(url=url, time_scale=sim.time_scale, **load)
            summaries[arm.label] = await bench_to_dir(cfg, out_dir / arm.folder, console=console, label=arm.label,
                                                      tables=tables)
    return summaries
