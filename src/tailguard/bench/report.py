"""The bench's output folder and the calls the CLI and the demo use: run and write a folder,
re-render a folder from its saved requests.jsonl, compare two folders.

    summary = await bench_to_dir(BenchConfig(url=url, workload="seed-mixed", concurrency=16,
                                             requests=400), Path("out/before"), console=Console())
    cmp = compare_dirs(Path("out/before"), Path("out/after"), console=Console())

A folder holds `requests.jsonl` (one record per request), `run.json` (how the run was made),
`summary.json` and `report.html`; compare writes `compare.json` and `compare.html`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from tailguard import __version__
from tailguard.bench.attribution import attribute_all
from tailguard.bench.capacity import CAPACITY_JSON, compare as compare_capacity
from tailguard.bench.compare import compare
from tailguard.bench.configs import config_lines
from tailguard.bench.html import render_compare, render_report
from tailguard.bench.load import BenchConfig, RunResult
from tailguard.bench.run import run_bench
from tailguard.bench.recorder import RequestRecord, read_jsonl, write_jsonl
from tailguard.bench.program_stats import program_comparison, program_summary, programs_table
from tailguard.bench.stats import summarize
from tailguard.bench.compare_table import print_comparison
from tailguard.bench.table import ProgressDisplay, print_summary
from tailguard.errors import ConfigError

REQUESTS_FILE = "requests.jsonl"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
COMPARE_JSON = "compare.json"
COMPARE_HTML = "compare.html"
DOCTOR_FILE = "doctor.json"  # written by `tailguard doctor`; the report shows its findings


def _dump(obj: Any, path: Path) -> None:
    path.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2) + b"\n")


def write_outputs(result: RunResult, out_dir: Path, *, console: Console | None = None,
                  html: bool = True) -> dict[str, Any]:
    """Write the folder for a finished run; prints the tables when given a console. Returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    attribute_all(result.records)
    write_jsonl(result.records, out_dir / REQUESTS_FILE)
    _dump(result.meta, out_dir / RUN_FILE)
    # Summarise what was saved (times rounded to the microsecond), so `rerender` reproduces it exactly.
    records, meta = load_run(out_dir)
    return _render(records, meta, out_dir, console=console, html=html)


def _render(records: list[RequestRecord], meta: dict[str, Any], out_dir: Path, *,
            console: Console | None, html: bool) -> dict[str, Any]:
    summary = summarize(records, meta)
    programs = program_summary(records)  # an agent workload's programs (`bench.programs`)
    if programs is not None:
        summary["programs"] = programs
    _dump(summary, out_dir / SUMMARY_FILE)
    if html:
        if any(r.attribution is None for r in records):  # a folder saved before attribution existed
            attribute_all(records)
        doctor_path = out_dir / DOCTOR_FILE
        doctor = orjson.loads(doctor_path.read_bytes()) if doctor_path.is_file() else None
        (out_dir / REPORT_FILE).write_text(render_report(summary, records, __version__, doctor), encoding="utf-8")
    if console is not None:
        print_summary(summary, console)
        if programs is not None:
            console.print(programs_table(programs))
        console.print(f"wrote {out_dir}/{{{SUMMARY_FILE}, {REQUESTS_FILE}{', ' + REPORT_FILE if html else ''}}}",
                      soft_wrap=True)
    return summary


def load_run(run_dir: Path) -> tuple[list[RequestRecord], dict[str, Any]]:
    """A saved run: its records and its run.json (an empty description if run.json is missing)."""
    path = run_dir / REQUESTS_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a bench output folder: {REQUESTS_FILE} is missing (give the folder "
                          "a `tailguard bench --out DIR` run wrote)")
    meta_path = run_dir / RUN_FILE
    meta: dict[str, Any] = orjson.loads(meta_path.read_bytes()) if meta_path.is_file() else {}
    try:
        records = read_jsonl(path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return records, meta


def rerender(run_dir: Path, *, console: Console | None = None) -> dict[str, Any]:
    """Rebuild summary.json and report.html from a folder's requests.jsonl (and run.json)."""
    records, meta = load_run(run_dir)
    return _render(records, meta, run_dir, console=console, html=True)


def compare_dirs(before: Path, after: Path, out_dir: Path | None = None, *,
                 console: Console | None = None) -> dict[str, Any]:
    """Compare two folders; writes compare.json and compare.html into `out_dir` (default: `after`)."""
    rb, mb = load_run(before)
    ra, ma = load_run(after)
    mb.setdefault("label", before.name)
    ma.setdefault("label", after.name)
    cmp = compare(rb, mb, ra, ma, seed=int(ma.get("seed") or 0))
    programs = program_comparison(rb, ra)
    if programs is not None:
        cmp["programs"] = programs
    capacities = [d / CAPACITY_JSON for d in (before, after)]
    if all(p.is_file() for p in capacities):  # two `--find-capacity` folders: their capacities too
        cmp["capacity"] = compare_capacity(*(orjson.loads(p.read_bytes()) for p in capacities))
    out = out_dir or after
    out.mkdir(parents=True, exist_ok=True)
    _dump(cmp, out / COMPARE_JSON)
    (out / COMPARE_HTML).write_text(render_compare(cmp, rb, ra, __version__), encoding="utf-8")
    if console is not None:
        print_comparison(cmp, console)
        c = cmp.get("capacity")
        if c is not None:
            low, high = c["interval"]
            console.print(f"capacity at the SLO: {_rate(c['before_per_s'])} -> {_rate(c['after_per_s'])}, ratio "
                          f"{_x(c['ratio'])} (between {_x(low)} and {_x(high)} by the two searches' brackets)",
                          soft_wrap=True)
        for line in config_lines(cmp.get("config")):
            console.print(line, style="bold yellow" if line.startswith("warning") else None, soft_wrap=True)
        console.print(f"wrote {out}/{{{COMPARE_JSON}, {COMPARE_HTML}}}")
    return cmp


def _rate(v: float | None) -> str:
    return "-" if not v else f"{v:.4g}/s"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


async def bench_to_dir(config: BenchConfig, out_dir: Path, *, console: Console | None = None,
                       progress: bool = True, label: str | None = None,
                       stop: asyncio.Event | None = None, tables: bool = True) -> dict[str, Any]:
    """Run `config`, show a progress bar and (with `tables`) the tables on `console`, write the folder,
    return the summary. Setting `stop` ends the run early; the folder is written all the same, marked
    interrupted."""
    if console is not None and progress:
        with ProgressDisplay(console) as show:
            result = await run_bench(config, progress=show, stop=stop)
    else:
        result = await run_bench(config, stop=stop)
    if label is not None:
        result.meta["label"] = label
    announced = result.meta.get("target_time_scale")
    if console is not None and config.time_scale is None and announced not in (None, 1.0):
        console.print(f"times in simulated seconds: {config.url} announced time scale {announced:g} "
                      "(--time-scale 1 reports wall seconds)", soft_wrap=True)
    return write_outputs(result, out_dir, console=console if tables else None)
