"""`tailguard demo`: the seed problem and its fix in about a minute and a half (30 s of load per arm), on the built-in simulator.

Runs `seed-mixed` (mostly 32-token chats, some 2048-token summaries) from 16 closed-loop clients
straight at a simulated H100 engine (max_num_seqs 8, first-come-first-served), then through the
gateway in front of an identical engine, and prints the before/after comparison, ending with the
README's headline table (`headline`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.table import Table


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    out: Path = typer.Option(Path("runs/demo"), help="Output folder: before/, after/, compare.html, logs/"),
    duration: float = typer.Option(30.0, help="Wall seconds of load per arm (warm-up included)."),
    concurrency: int = typer.Option(16, help="Closed-loop clients."),
    time_scale: float = typer.Option(
        0.25, help="Simulator time scale: wall seconds per simulated second (latencies are reported in simulated seconds)."),
    max_num_seqs: int = typer.Option(8, help="The engine's --max-num-seqs, and the gateway's in-flight cap."),
    policy: str = typer.Option("ranked-sjf", help="Gateway scheduler policy for the after arm."),
    seed: int = typer.Option(0, help="Workload seed (both arms get the same request stream)."),
    record: bool = typer.Option(
        False, "--record",
        help="Record the after arm's gateway (its front's events and decisions, each request's sizes and times) to "
        "OUT/after/front.jsonl, for `tailguard replay`."),
) -> None:
    """Show the tail-latency problem and the fix: straight to the simulator vs through the gateway."""
    from tailguard.bench.report import compare_dirs
    from tailguard.bench.validity import verdict_line
    from tailguard.cli.bench import console as make_console, run_async
    from tailguard.cli.experiment import Arm, SimSpec, run_arms

    console = make_console()
    sim = SimSpec(max_num_seqs=max_num_seqs, time_scale=time_scale)
    load = {"workload": "seed-mixed", "concurrency": concurrency, "duration_s": duration,
            "warmup_s": duration * 0.1, "seed": seed}
    recording = out / "after" / "front.jsonl" if record else None
    # Recorded, the gateway runs from a config file (the same defaults) whose backend is named
    # `sim`, so that another config for `tailguard replay --config` can name it the same.
    arms = [Arm("before"),
            Arm("after", gateway=True, policy=policy, max_concurrency=max_num_seqs,
                config={} if record else None, record=recording)]
    console.print(f"[bold]tailguard demo[/]: simulator {sim.preset}, max_num_seqs {max_num_seqs}, time scale "
                  f"{time_scale} (1 wall second = {1 / time_scale:g} simulated seconds; figures are simulated seconds)")
    summaries = run_async(run_arms(arms, sim, load, out, console=console, tables=False))
    for label, s in summaries.items():
        console.print(f"{label}: {s['overall']['count']} requests measured; {verdict_line(s['validity'])}",
                      soft_wrap=True)
    console.rule("[bold]before vs after")
    cmp = compare_dirs(out / "before", out / "after", out, console=console)
    console.print(headline(cmp, concurrency))
    if recording is not None:
        console.print(f"the after run's gateway was recorded: tailguard replay {recording} [--config OTHER.yaml] "
                      "(docs/tuning.md, \"Replaying yesterday's traffic\")", soft_wrap=True)


def headline(cmp: dict[str, Any], concurrency: int) -> "Table":
    """The README's compact table: the chat tail, the summaries' cost and the tokens/s kept."""
    from tailguard.bench.compare_table import headline_table

    return headline_table(cmp, f"seed-mixed, {concurrency} clients, simulated seconds; before: straight to the "
                          "engine, after: through tailguard serve")
