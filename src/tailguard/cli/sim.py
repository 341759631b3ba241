"""`tailguard sim`: the engine simulator as an OpenAI-compatible server (vLLM's flag names)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from tailguard.cli import listen_error

if TYPE_CHECKING:
    from tailguard.sim.cost import EngineConfig
    from tailguard.sim.fault import Faults


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)


def sim(
    port: int = typer.Option(8000, "--port", "-p", min=0, max=65535, help="Port to listen on (vLLM's default)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    preset: str = typer.Option("h100-llama8b", "--preset", help="Engine preset: h100-llama8b, a100-llama8b, cpu-tiny."),
    time_scale: float = typer.Option(
        1.0, "--time-scale", min=1e-6, help="Wall seconds per simulated second: 0.1 runs ten times faster than real time."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", min=1, help="Sequences batched at once."),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens", min=1, help="Token budget of one step (chunked prefill)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=1, help="Prompt + output limit."),
    kv_cache_tokens: Optional[int] = typer.Option(None, "--kv-cache-tokens", min=1, help="KV-cache capacity in tokens."),
    enable_prefix_caching: Optional[bool] = typer.Option(
        None, "--enable-prefix-caching/--no-enable-prefix-caching", help="Reuse cached prompt-prefix blocks."),
    scheduling_policy: Optional[str] = typer.Option(
        None, "--scheduling-policy", help="fcfs, or priority (requests' `priority`: lower first)."),
    output_length: Optional[str] = typer.Option(
        None, "--output-length", help="exact (max_tokens, like ignore_eos), uniform or exponential."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for drawn output lengths."),
    model_name: Optional[str] = typer.Option(
        None, "--model-name",
        help="Model id served by /v1/models; a request for another model then gets vLLM's 404 (model_not_found). "
             "Unset: serves 'tailguard-sim' and answers whatever model is asked."),
    slowdown: float = typer.Option(
        1.0, "--slowdown", min=1e-6, help="Every engine step takes this many times longer: a slower host."),
    fault: Optional[str] = typer.Option(
        None, "--fault", help="hang (accept and read every request, answer none), hang-completions (health, "
                              "models and metrics answer; completions never do) or stall (the engine stops: "
                              "streams stay open with no more tokens, health answers)."),
    error_rate: float = typer.Option(
        0.0, "--error-rate", min=0.0, max=1.0, help="Share of completion requests answered 500 (evenly spread)."),
    throttle: float = typer.Option(
        1.0, "--throttle", min=1e-3, max=1.0,
        help="The GPU is held down two simulated seconds in every four (a card at its power or thermal limit): its "
             "clocks fall to this share of their maximum, its steps take 1/share as long, and its DCGM gauges "
             "(SM clock, power at its limit) say so. 1: never."),
    fault_after_s: float = typer.Option(
        0.0, "--fault-after-s", min=0.0,
        help="Simulated seconds after start before --fault, --error-rate and --throttle apply."),
) -> None:
    """Simulate a continuous-batching engine (vLLM-like) behind an OpenAI-compatible API."""
    from tailguard.errors import ConfigError
    from tailguard.sim.cost import EngineConfig
    from tailguard.sim.fault import Faults

    try:
        config = EngineConfig.from_preset(
            preset, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, kv_cache_tokens=kv_cache_tokens,
            enable_prefix_caching=enable_prefix_caching, scheduling_policy=scheduling_policy,
            output_length=output_length, seed=seed,
        ).slowed(slowdown)
        faults = Faults(fault, error_rate, fault_after_s, throttle)  # type: ignore[arg-type]  # checked by Faults
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    _run(config, host, port, time_scale, model_name, slowdown, faults)


def _run(config: EngineConfig, host: str, port: int, time_scale: float, model_name: str | None, slowdown: float,
         faults: Faults) -> None:
    import asyncio
    import contextlib
    import signal

    from tailguard.sim.server import DEFAULT_MODEL_NAME, RunningSim, serve

    served = model_name if model_name is not None else DEFAULT_MODEL_NAME

    def ready(sim: RunningSim) -> None:
        c = config
        typer.echo(
            f"tailguard sim listening on {sim.url} (OpenAI base URL {sim.url}/v1; max_num_seqs={c.max_num_seqs} "
            f"max_num_batched_tokens={c.max_num_batched_tokens} max_model_len={c.max_model_len} "
            f"kv_cache_tokens={c.kv_cache_tokens} policy={c.scheduling_policy} "
            f"prefix_caching={c.enable_prefix_caching} time_scale={time_scale} slowdown={slowdown} "
            f"model={served}{'' if model_name is not None else ' (any model asked)'} fault={faults.fault or 'none'} "
            f"error_rate={faults.error_rate} throttle={faults.throttle} gpu={c.gpu.model_name if c.gpu else 'none'})",
            err=True,
        )

    async def main() -> None:
        # SIGINT and SIGTERM stop the server cleanly (streams closed, port released).
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(config, host, port, time_scale, served, ready=ready, faults=faults,
                        strict_model=model_name is not None)

    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - Windows
            asyncio.run(main())
        else:
            uvloop.run(main())
    except KeyboardInterrupt:
        pass
    except OSError as e:
        typer.echo(f"error: {listen_error(host, port, e)}", err=True)
        raise typer.Exit(1) from None
