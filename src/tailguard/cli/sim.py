"""`tailguard sim`: the engine simulator as an OpenAI-compatible server (vLLM's flag names)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from tailguard.cli import listen_error

if TYPE_CHECKING:
    from tailguard.sim.cost import EngineConfig


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
    model_name: str = typer.Option("tailguard-sim", "--model-name", help="Model id served by /v1/models."),
) -> None:
    """Simulate a continuous-batching engine (vLLM-like) behind an OpenAI-compatible API."""
    from tailguard.errors import ConfigError
    from tailguard.sim.cost import EngineConfig

    try:
        config = EngineConfig.from_preset(
            preset, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, kv_cache_tokens=kv_cache_tokens,
            enable_prefix_caching=enable_prefix_caching, scheduling_policy=scheduling_policy,
            output_length=output_length, seed=seed,
        )
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    _run(config, host, port, time_scale, model_name)


def _run(config: EngineConfig, host: str, port: int, time_scale: float, model_name: str) -> None:
    import asyncio
    import contextlib
    import signal

    from tailguard.sim.server import RunningSim, serve

    def ready(sim: RunningSim) -> None:
        c = config
        typer.echo(
            f"tailguard sim listening on {sim.url} (OpenAI base URL {sim.url}/v1; max_num_seqs={c.max_num_seqs} "
            f"max_num_batched_tokens={c.max_num_batched_tokens} max_model_len={c.max_model_len} "
            f"kv_cache_tokens={c.kv_cache_tokens} policy={c.scheduling_policy} "
            f"prefix_caching={c.enable_prefix_caching} time_scale={time_scale})",
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
            await serve(config, host, port, time_scale, model_name, ready=ready)

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
