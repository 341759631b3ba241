"""`tailguard serve`: run the gateway from a config file, or from `--backend` URLs with the
default classes, or in front of an in-process simulator with `--sim`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from tailguard.cli import listen_error

if TYPE_CHECKING:
    from tailguard.config import GatewayConfig
    from tailguard.gateway.ops.store import ConfigStore


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="tailguard.yaml to load."),
    backend: Optional[list[str]] = typer.Option(
        None, "--backend", "-b", help="Upstream base URL (repeat for several); the quick form without a config."),
    backend_kind: str = typer.Option(
        "auto", "--backend-kind",
        help="Kind of the --backend servers: auto (ask each server), vllm, llamacpp, sglang, tgi, openai or "
        "sim (class -> engine priority, whether a batch request can be suspended and continued)."),
    max_concurrency: Optional[int] = typer.Option(
        None, "--max-concurrency", min=1, help="In-flight cap per backend (the engine's --max-num-seqs)."),
    host: Optional[str] = typer.Option(None, "--host", help="Address to listen on (default 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", "-p", min=0, max=65535, help="Port to listen on (default 8080)."),
    policy: Optional[str] = typer.Option(None, "--policy", help="Scheduler policy: ranked-sjf or fcfs."),
    sim: bool = typer.Option(False, "--sim", help="Start the built-in simulator in-process and use it as the backend."),
    sim_preset: Optional[str] = typer.Option(None, "--sim-preset", help="Simulator preset (with --sim)."),
    sim_time_scale: float = typer.Option(1.0, "--sim-time-scale", min=1e-6, help="Simulator time scale (with --sim)."),
    sim_port: int = typer.Option(
        0, "--sim-port", min=0, max=65535,
        help="Port of the simulator (with --sim; default: a free one). Its URL is printed at start-up, so a "
        "bench can also be sent straight to it."),
    state_dir: Optional[Path] = typer.Option(
        None, "--state-dir",
        help="Where every applied config is kept, numbered and hashed, for `tailguard config` (default: "
        ".tailguard/<config name>/ beside --config; without --config, none unless given)."),
    record: Optional[Path] = typer.Option(
        None, "--record", metavar="FILE",
        help="Write the front's events and decisions, and each request's sizes and times (no prompt text, "
        "no keys), to FILE as JSON lines, for `tailguard replay`."),
    log_format: Optional[str] = typer.Option(
        None, "--log-format", metavar="json|text",
        help="The gateway's own log lines on stderr: one JSON object a line (json, the default), or plain text for "
        "a terminal (text). Overrides the config's log_format."),
    access_log: Optional[bool] = typer.Option(
        None, "--access-log/--no-access-log",
        help="One JSON line per request on stderr (on by default; overrides the config's access_log). Send stderr to "
        "a file to keep them out of a terminal: 2> gateway.log"),
    workers: int = typer.Option(
        1, "--workers", min=1,
        help="Gateway processes on the one port (SO_REUSEPORT), to use more than one core. Without `state.url` "
        "each gets 1/N of every cap (max_concurrency, rate limits, queues, connections); with it, slots and "
        "rate limits are one count in Redis and stay whole (docs/scale-out.md)."),
) -> None:
    """Run the gateway: OpenAI-compatible API that serves short and interactive requests first."""
    from tailguard.errors import ConfigError

    logs = Logs(log_format, access_log)

    def reread() -> GatewayConfig:
        return build_config(config, backend or [], max_concurrency, host, port, policy, sim, backend_kind, logs)

    try:
        cfg = reread()
        _check_start(record, workers, sim, sim_preset)
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    rereads = reread if config is not None else None
    if workers > 1:
        _serve_workers(cfg, workers, rereads)
        return
    store = _claimed_store(state_dir, config)
    _run(_main(cfg, sim, sim_preset, sim_time_scale, sim_port, store, rereads, record))


def _check_start(record: Path | None, workers: int, sim: bool, sim_preset: str | None) -> None:
    """What would fail once the gateway starts, refused before it does: a recording file it
    cannot write, several workers with one simulator or one recording, an unknown preset."""
    from tailguard.errors import ConfigError

    if record is not None:
        try:  # here, not as the gateway starts, where an OSError reads as a port that cannot be had
            record.open("w").close()
        except OSError as e:
            raise ConfigError(f"--record {record}: {e.strerror or e}") from None
    if workers > 1 and (sim or record is not None):
        raise ConfigError("--workers runs several gateways: give it a backend of its own (not --sim), "
                          "and record one gateway at a time (no --record)")
    if sim:
        from tailguard.sim.cost import EngineConfig

        EngineConfig.from_preset(sim_preset or "h100-llama8b")  # an unknown preset fails here, clearly


def _claimed_store(state_dir: Path | None, config: Path | None) -> ConfigStore | None:
    """The config history this gateway keeps (`--state-dir`, or beside `--config`), claimed for
    it before the simulator or the port: a second gateway on that directory starts nothing."""
    from tailguard.errors import ConfigError
    from tailguard.gateway.ops.store import ConfigStore, default_state_dir

    root = state_dir or (default_state_dir(config) if config is not None else None)
    if root is None:
        return None
    store = ConfigStore(root)
    try:
        store.claim()
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    return store


def _serve_workers(cfg: GatewayConfig, n: int, reread: Callable[[], GatewayConfig] | None) -> None:
    """`--workers N`: each worker serves 1/N of every cap (`config.workers`) on the shared
    port; a SIGHUP rereads the file in every worker. The config history (`tailguard config`) is
    not kept: N processes would each record it and claim its pid file."""
    from tailguard.cli.workers import hold_port, run_workers
    from tailguard.config.workers import per_worker

    from tailguard.gateway.ops.audit import default_chain

    port, holder = hold_port(cfg.host, cfg.port)

    def share(c: GatewayConfig, index: int) -> GatewayConfig:
        c = per_worker(c, n).model_copy(update={"port": port})
        if c.audit.chain is None:  # each worker appends to an audit chain of its own
            c = c.model_copy(update={"audit": c.audit.model_copy(update={"chain": f"{default_chain(c)}/w{index}"})})
        return c

    def worker(index: int) -> None:
        if holder is not None:
            holder.close()
        _run(_gateway(share(cfg, index), None, None, (lambda: share(reread(), index)) if reread else None, None,
                      reuse_port=True))

    status = run_workers(n, worker)
    if status:
        raise typer.Exit(status)


@dataclass(frozen=True)
class Logs:
    """`--log-format` and `--access-log`: None leaves the config's setting as it is."""

    format: str | None = None
    access: bool | None = None

    def update(self) -> dict[str, Any]:
        from tailguard.errors import ConfigError
        from tailguard.gateway.ops.logfmt import FORMATTERS

        if self.format is not None and self.format not in FORMATTERS:
            raise ConfigError(f"--log-format {self.format!r}: known formats are {', '.join(FORMATTERS)}")
        return {k: v for k, v in (("log_format", self.format), ("access_log", self.access)) if v is not None}


def build_config(
    config: Path | None, backends: list[str], max_concurrency: int | None, host: str | None,
    port: int | None, policy: str | None, sim: bool, backend_kind: str = "auto", logs: Logs = Logs(),
) -> GatewayConfig:
    """The config from the file (or the quick form), with command-line overrides applied."""
    from tailguard.errors import ConfigError
    from tailguard.config import GatewayConfig, load_config

    if policy is not None and policy not in ("ranked-sjf", "fcfs"):
        raise ConfigError(f"--policy {policy!r}: known policies are ranked-sjf, fcfs")
    update: dict[str, Any] = logs.update()
    if sim and backends:
        raise ConfigError("--sim and --backend are exclusive: --sim is the backend")
    if config is not None:
        cfg = load_config(config)
        if backends:
            raise ConfigError("--backend cannot be combined with --config (list backends in the file)")
    elif backends:
        cfg = GatewayConfig.quick(backends, max_concurrency or 8, backend_kind)
    elif sim:
        # The real URL is filled in once the simulator listens (its port is picked then).
        cfg = GatewayConfig.quick(["http://127.0.0.1:1"], max_concurrency or 8)
    else:
        raise ConfigError("nothing to serve: give --config FILE, --backend URL or --sim")
    if host is not None:
        update["host"] = host
    if port is not None:
        update["port"] = port
    if policy is not None:
        update["scheduler"] = cfg.scheduler.model_copy(update={"policy": policy})
    if max_concurrency is not None and config is not None:
        update["backends"] = [b.model_copy(update={"max_concurrency": max_concurrency}) for b in cfg.backends]
    if sim and config is not None and not cfg.backends:
        raise ConfigError("--sim with --config needs one backend entry in the file for the simulator to take over")
    if update:
        cfg = cfg.model_copy(update=update)
    if not cfg.backends and not sim:
        raise ConfigError(f"{config}: no backends configured")
    return cfg


class CannotListen(Exception):
    """A port to listen on was taken (or not ours to take): said in one line, as `tailguard sim` says it."""


async def _main(cfg: GatewayConfig, sim: bool, preset: str | None, time_scale: float, sim_port: int,
                store: ConfigStore | None, reread: Callable[[], GatewayConfig] | None, record: Path | None) -> None:
    if not sim:
        await _gateway(cfg, None, store, reread, record)
        return
    from tailguard.sim.cost import EngineConfig
    from tailguard.sim.server import running_sim

    # The simulated engine batches exactly as many sequences as the gateway lets through, as a
    # vLLM started with --max-num-seqs equal to the backend's max_concurrency would.
    engine = EngineConfig.from_preset(preset or "h100-llama8b", max_num_seqs=cfg.backends[0].max_concurrency)
    async with contextlib.AsyncExitStack() as stack:
        try:
            running = await stack.enter_async_context(running_sim(engine, time_scale=time_scale, port=sim_port))
        except OSError as e:
            raise CannotListen(listen_error("127.0.0.1", sim_port, e, "--sim-port")) from None
        def on_sim(c: GatewayConfig) -> GatewayConfig:
            first = c.backends[0].model_copy(update={"url": running.url, "kind": "sim", "name": "sim"})
            return c.model_copy(update={"backends": [first]})

        scale = f" --time-scale {time_scale:g}" if time_scale != 1.0 else ""
        await _gateway(on_sim(cfg), f"simulator listening on {running.url} (max_num_seqs={engine.max_num_seqs}, "
                                    f"time scale {time_scale:g}); to measure it straight: tailguard bench --url "
                                    f"{running.url}{scale}", store, (lambda: on_sim(reread())) if reread else None,
                       record)


async def _gateway(cfg: GatewayConfig, first_line: str | None, store: ConfigStore | None,
                   reread: Callable[[], GatewayConfig] | None, record: Path | None, *, reuse_port: bool = False) -> None:
    """Serve until stopped; an OSError before the gateway listens is its port, said in one line.
    `first_line` is printed once the gateway listens, so a busy port prints nothing else."""
    from tailguard.gateway.http.app import serve as serve_gateway

    listening = False

    def ready(url: str) -> None:  # the gateway's own start line is in its log
        nonlocal listening
        listening = True
        if first_line is not None:
            typer.echo(first_line, err=True)

    try:
        await serve_gateway(cfg, ready=ready, store=store, reread=reread, record=record, reuse_port=reuse_port)
    except OSError as e:
        if listening:
            raise
        raise CannotListen(listen_error(cfg.host, cfg.port, e)) from None


def _run(coro: Any) -> None:
    from tailguard.errors import ConfigError

    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - Windows
            import asyncio

            asyncio.run(coro)
            return
        uvloop.run(coro)
    except CannotListen as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except ConfigError as e:  # found as the gateway starts (a store it cannot open)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
