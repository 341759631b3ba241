"""`tailguard replay FILE [--config OTHER.yaml]`: a recording of `tailguard serve --record` replayed
on a fresh front, which must decide exactly what the gateway's did; with `--config`, the recorded
traffic simulated under the recorded config and under another, on an engine fitted to the
recording, per class side by side (docs/tuning.md, "Replaying yesterday's traffic")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from tailguard.recording.codec import Recording
    from tailguard.sweep.whatif import WhatIf


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def replay(
    recording: Path = typer.Argument(..., help="A file written by `tailguard serve --record`."),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c",
        help="Another tailguard.yaml: simulate the recorded traffic under it and show what would have changed."),
    preset: str = typer.Option(
        "h100-llama8b", "--preset",
        help="With --config: the engine model whose shape is fitted to the recording (its level comes from the "
        "recorded prefill and decode times)."),
    max_num_seqs: Optional[int] = typer.Option(
        None, "--max-num-seqs", min=1,
        help="With --config: the real engine's batch limit (default: the recorded config's slots, summed)."),
) -> None:
    """Replay a recording on a fresh front (the same decisions?); with --config, what would have changed."""
    from tailguard.errors import ConfigError
    from tailguard.recording.codec import RecordingError, read
    from tailguard.recording.replay import conform

    try:
        with open(recording, encoding="utf-8") as f:
            rec = read(f)
    except OSError as e:
        typer.echo(f"error: {recording}: {e.strerror or e}; give a recording that `tailguard serve --record FILE` "
                   "(or `tailguard demo --record`) wrote", err=True)
        raise typer.Exit(2) from None
    except RecordingError as e:
        typer.echo(f"error: {recording}: {e}", err=True)
        raise typer.Exit(2) from None
    result = conform(rec)
    typer.echo(f"{recording}: {result}")
    if config is not None:
        try:
            _what_if(rec, config, preset, max_num_seqs)
        except (ConfigError, ValueError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    if not result.identical:
        raise typer.Exit(1)


def _what_if(rec: Recording, config: Path, preset: str, max_num_seqs: int | None) -> None:
    from tailguard.cli.bench import console as make_console
    from tailguard.gateway.upstream.backends import resolved
    from tailguard.config import load_config
    from tailguard.gateway.upstream.kinds import get_kind
    from tailguard.settings import described, flatten
    from tailguard.sim.cost import EngineConfig
    from tailguard.sweep.whatif import what_if

    other = load_config(config)
    params = other.front_params({b.name: get_kind(resolved(b).kind).continues_generation for b in other.backends})
    report = what_if(rec, params, EngineConfig.from_preset(preset), max_num_seqs)
    console = make_console()
    h = rec.header
    console.print(f"{report.requests} requests over {report.span_s:.1f} s (the recording's clock: the gateway's "
                  f"seconds); recorded config {h.config_hash or '(unknown)'}, {config} {other.digest()}", soft_wrap=True)
    if h.settings is not None:
        changes = described(flatten(h.settings), flatten(other.settings()))
        console.print(f"{config} changes: " + ("; ".join(changes) if changes else "nothing"), soft_wrap=True)
    console.print(_fit_line(report, preset), soft_wrap=True)
    console.print(_table(report, config.name))
    for note in report.notes:
        console.print(f"note: {note}", soft_wrap=True)


def _fit_line(report: WhatIf, preset: str) -> str:
    f, c = report.fit, report.fit.cost
    per_backend = "".join(f"; {b}: decode x{bf.decode_scale:.3g}, prefill x{bf.prefill_scale:.3g}"
                          for b, bf in report.by_backend.items()) if len(report.by_backend) > 1 else ""
    how = f"from {f.prefill_samples} requests' prompts" if f.prefill_from_prompts else "prompts alike: as decode"
    return (f"engine fitted to the recording ({preset}'s shape): decode x{f.decode_scale:.3g} of the preset "
            f"(from {f.decode_samples} requests: a step {c.a_s * 1e3:.2f} ms + {c.c_s_per_decode_seq * 1e6:.2f} us a "
            f"sequence + {c.d_s_per_kv_token * 1e9:.2f} ns a KV token), prefill x{f.prefill_scale:.3g} "
            f"({c.b_s_per_prefill_token * 1e6:.2f} us a prompt token; {how}), {f.overhead_s * 1e3:.2f} ms to first "
            f"content that no step explains (added to each simulated TTFT){per_backend}")


def _table(report: WhatIf, other_name: str) -> Table:
    from tailguard.bench.table import fit, fmt_ratio, fmt_s, table
    from tailguard.sweep.whatif import OTHER, RECORDED, RESIMULATED, STATS

    t = table("per class, seconds on the recording's clock", ("class", "", "recorded", "re-simulated", other_name,
                                                               "fit: re-sim/rec"), left=2)
    cols = report.columns
    for cls in sorted(cols[RECORDED]):
        got = {name: cols[name].get(cls) for name in (RECORDED, RESIMULATED, OTHER)}
        agree = report.agreement(cls)
        counts = ["-" if s is None else str(s.requests) for s in got.values()]
        t.add_row(cls, "requests", *counts, "")
        for key in STATS:
            metric, q = key
            cells = ["-" if s is None else fmt_s(s.stats[key]) for s in got.values()]
            t.add_row("", f"{'queue' if metric == 'queue_s' else 'TTFT'} P{q:.0f}", *cells, fmt_ratio(agree[key]))
        t.add_row("", "rejected", *["-" if s is None else _rejected(s.rejected) for s in got.values()], "")
        t.add_row("", "preempted", *["-" if s is None else str(s.preemptions) for s in got.values()], "")
    return fit(t)


def _rejected(by_reason: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(by_reason.items())) if by_reason else "0"
