"""`tailguard replay FILE [--config OTHER.yaml]`: a recording of `tailguard serve --record` replayed
on a fresh front, which must decide exactly what the gateway's did; with `--config`, the recorded
traffic simulated under the recorded config and under another, on an engine fitted to the
recording, per class side by side (docs/tuning.md, "Replaying yesterday's traffic"). FILE may
also be a request trace (`bench --trace`'s formats: the gateway's access log, a bench run's
requests.jsonl, Azure, BurstGPT, Mooncake): its arrivals and sizes then run through the DES behind
`--config` (its backends each a simulated engine), beside what the log recorded where it did."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from tailguard.bench.recorder import RequestRecord
    from tailguard.bench.trace.plan import Replay, TraceSpec

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
        help="With --config: the real engine's batch limit (default: the recorded config's slots, summed; for a "
        "trace, each backend's max_concurrency)."),
    trace_format: Optional[str] = typer.Option(None, help="FILE is a trace in this format (default: found from its "
                                               "first line): azure, burstgpt, mooncake or tailguard"),
    speed: float = typer.Option(1.0, help="A trace: X times its rate"),
    window: Optional[str] = typer.Option(None, help="A trace: START:DURATION of it, in its seconds"),
    limit: Optional[int] = typer.Option(None, help="A trace: its first N requests"),
    rules: Optional[Path] = typer.Option(None, help="A trace: the rule file mapping its fields to classes"),
    out: Optional[Path] = typer.Option(None, help="A trace: write the simulated run as a bench folder here"),
) -> None:
    """Replay a recording on a fresh front (the same decisions?); with --config, what would have changed."""
    from tailguard.errors import ConfigError
    from tailguard.recording.codec import RecordingError, read
    from tailguard.recording.replay import conform

    if trace_format is not None or not _is_recording(recording):
        from tailguard.bench.trace.plan import TraceSpec

        spec = TraceSpec(str(recording), trace_format, speed, window, limit, None if rules is None else str(rules))
        try:
            _trace_what_if(spec, config, preset, max_num_seqs, out)
        except ConfigError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        return
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


def _is_recording(path: Path) -> bool:
    """Whether `path` starts as a front recording does (else it is read as a trace)."""
    from tailguard.recording.codec import FORMAT

    try:
        with open(path, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return True  # the recording reader says what is wrong with it
    return FORMAT in first


def _trace_what_if(spec: "TraceSpec", config: Path | None, preset: str, max_num_seqs: int | None,
                   out: Path | None) -> None:
    """A trace on the DES behind `config`: the bench's tables of the simulated run, and per class
    what the log recorded beside what the simulation gives, where the log has it."""
    from rich.console import Console

    from tailguard.bench.load import RunResult
    from tailguard.bench.report import write_outputs
    from tailguard.bench.stats import summarize
    from tailguard.bench.table import print_summary
    from tailguard.bench.trace.plan import load_replay
    from tailguard.config import load_config
    from tailguard.errors import ConfigError
    from tailguard.sim.cost import EngineConfig
    from tailguard.sweep.virtual import VirtualRun, run_virtual

    if config is None:
        raise ConfigError(f"{spec.path} is a request trace, not a recording: it holds no decisions to replay; give "
                          "--config tailguard.yaml to see what that config would have done with its requests")
    gateway = load_config(config)
    seqs = max_num_seqs or max(b.max_concurrency for b in gateway.backends)
    engine = EngineConfig.from_preset(preset, max_num_seqs=seqs)
    replay = load_replay(spec)
    records, meta, _ = run_virtual(VirtualRun.of_trace(engine, replay, gateway))
    meta["label"] = f"{config.name} (simulated)"
    console = Console()
    console.print(f"{len(records)} requests of {spec.path} on the discrete-event simulator behind {config} "
                  f"({len(gateway.backends)} backend(s), each a {preset} engine of {seqs} sequences; the engine is "
                  "the preset's model, not fitted to the log)", soft_wrap=True)
    summary = write_outputs(RunResult(records, meta), out) if out is not None else summarize(records, meta)
    print_summary(summary, console)
    table = _recorded_table(replay, records, config.name)
    if table is not None:
        console.print(table)
    if out is not None:
        console.print(f"wrote {out}/")


def _recorded_table(replay: "Replay", records: "list[RequestRecord]", other_name: str) -> "Table | None":
    """Per class: TTFT and E2E P50/P99 as the log recorded them and as simulated; None when the
    trace recorded no latencies (a public trace)."""
    import numpy as np

    from tailguard.bench.stats import percentile
    from tailguard.bench.table import fit, fmt_s, table
    from tailguard.bench.trace.jsonl import recorded_latency

    seen = [recorded_latency(r) for r in replay.requests]
    if not any(t is not None for t, _ in seen):
        return None
    t = table("recorded in the log vs simulated under " + other_name, ("class", "", "recorded", "simulated"), left=2)
    for cls in replay.class_names:
        rec = [lat for lat, c in zip(seen, replay.classes) if c.name == cls]
        sim = [r for r in records if r.cls == cls and r.ok]
        t.add_row(cls, "requests", str(len(rec)), str(len([r for r in records if r.cls == cls])))
        for i, name in ((0, "TTFT"), (1, "E2E")):
            mine = np.sort([x[i] for x in rec if x[i] is not None])
            theirs = np.sort([r.ttft_s if i == 0 else r.e2e_s for r in sim])
            for q in (50.0, 99.0):
                t.add_row("", f"{name} P{q:.0f}", fmt_s(percentile(mine, q)), fmt_s(percentile(theirs, q)))
    return fit(t)


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
