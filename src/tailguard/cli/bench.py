"""`tailguard bench` (run a workload and write a report folder), `tailguard bench compare BEFORE
AFTER`, `tailguard bench report DIR` (re-render from requests.jsonl) and `tailguard bench workloads`."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Coroutine, NoReturn, Optional, TypeVar

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from tailguard.bench.capacity import CapacitySearch
    from tailguard.bench.load import BenchConfig
    from tailguard.bench.trace.plan import TraceSpec

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop where it exists: its lower per-callback cost raises the generator's ceiling."""
    if sys.platform != "win32":
        import uvloop

        return uvloop.run(coro)
    import asyncio

    return asyncio.run(coro)


def parse_warmup(text: str) -> tuple[int, float]:
    """`--warmup 20` excludes the first 20 requests; `--warmup 5s` those due in the first 5 seconds."""
    from tailguard.errors import ConfigError

    t = text.strip().lower()
    try:
        if t.endswith("s"):
            return 0, float(t[:-1])
        return int(t), 0.0
    except ValueError:
        raise ConfigError(f"--warmup takes a request count (20) or seconds (5s), got {text!r}") from None


def console() -> "Console":
    """The console every verb prints to. A terminal gets its own width; a pipe or a file (`make
    demo > demo.txt`) gets room for the widest table, and its prose lines are never wrapped: rich
    would otherwise fold both at 80 columns, cutting a verdict mid-phrase."""
    import os

    from rich.console import Console

    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=150, soft_wrap=True)


def _fail(msg: str) -> NoReturn:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {msg}")  # one line, however long
    raise typer.Exit(1)


def bench_run(
    ctx: typer.Context,
    url: list[str] = typer.Option([], "--url", help="Server or gateway base URL, e.g. http://127.0.0.1:8000 "
                                  "(repeat it to spread requests over several servers, round-robin)"),
    workload: Optional[str] = typer.Option(None, help="Built-in workload name or a YAML file (default seed-mixed; "
                                           "fixed-lengths with --input-tokens or --output-tokens)"),
    input_tokens: Optional[str] = typer.Option(
        None, help="Every request's prompt tokens: 512, 512:64 (normal: mean:stddev) or 100..1000 (uniform)"),
    output_tokens: Optional[str] = typer.Option(
        None, help="Every request's max_tokens, same forms; sent with ignore_eos so answers are that long"),
    ignore_eos: Optional[bool] = typer.Option(
        None, "--ignore-eos/--no-ignore-eos", help="Send vLLM's ignore_eos (default: on with --output-tokens and "
        "--trace, else the workload's)"),
    trace: Optional[Path] = typer.Option(None, help="Replay this trace's arrivals and sizes (open loop) instead of "
                                         "a workload: docs/bench.md, \"Replaying a trace\""),
    trace_format: Optional[str] = typer.Option(None, help="azure, burstgpt, mooncake or tailguard (access log or "
                                               "requests.jsonl); default: found from the file's first line"),
    speed: float = typer.Option(1.0, help="With --trace: X times the trace's rate (2 halves every gap)"),
    window: Optional[str] = typer.Option(None, help="With --trace: START:DURATION of the trace to replay, in its "
                                         "seconds (600:300, 10m:5m)"),
    limit: Optional[int] = typer.Option(None, help="With --trace: replay its first N requests (of the window)"),
    rules: Optional[Path] = typer.Option(None, help="With --trace: a YAML rule file mapping trace fields to a class, "
                                         "its headers and body fields"),
    endpoint: Optional[str] = typer.Option(
        None, help="Route to drive: chat, completions, responses, messages or embeddings (default: the "
                   "workload's); TTFT and ITL are read from each route's own events"),
    out: Path = typer.Option(Path("bench-out"), help="Output folder"),
    concurrency: Optional[int] = typer.Option(None, help="Closed loop: N clients, each sends when its last reply ends"),
    rate: Optional[float] = typer.Option(None, help="Open loop: requests per wall second (against a simulator at "
                                         "--time-scale 0.25, 1 is 0.25 per simulated second)"),
    arrival: str = typer.Option("poisson", help="Open-loop arrivals: constant, poisson or gamma"),
    burstiness: float = typer.Option(1.0, help="gamma shape: 1 is Poisson, below 1 burstier"),
    requests: Optional[int] = typer.Option(None, help="Measured requests (warm-up comes on top); default 200"),
    duration: Optional[float] = typer.Option(None, help="Send for S seconds instead of a request count"),
    warmup: str = typer.Option("0", help="Excluded from statistics: a request count (20) or seconds (5s)"),
    seed: int = typer.Option(0, help="Same seed, same request stream"),
    model: Optional[str] = typer.Option(None, help="Model name (default: the first of GET /v1/models)"),
    api_key: Optional[str] = typer.Option(None, envvar="TAILGUARD_API_KEY", help="Sent as a Bearer token"),
    connect_timeout: float = typer.Option(10.0, help="Seconds to connect"),
    first_token_timeout: float = typer.Option(120.0, help="Seconds from send to the first content token"),
    timeout: float = typer.Option(600.0, help="Seconds from send to the end of the reply"),
    max_dispatch_lag_ms: float = typer.Option(5.0, help="Dispatch lag P99 above this (wall ms) marks the run invalid"),
    time_scale: Optional[float] = typer.Option(
        None, help="Report in simulated seconds of a `tailguard sim --time-scale X` (timeouts stay wall seconds); "
                   "default: the scale the target announces, else 1; 1 for wall seconds"),
    interrupt_grace: float = typer.Option(5.0, help="On Ctrl-C or SIGTERM: seconds requests in flight get to finish"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar"),
    scrape: list[str] = typer.Option([], "--scrape", help="Snapshot this server's /metrics during the run into "
                                     "metrics.jsonl, for `tailguard doctor` (repeatable: gateway and engine)"),
    gpu_metrics: list[str] = typer.Option([], "--gpu-metrics", help="A DCGM exporter (e.g. http://node:9400), "
                                          "scraped with --scrape's pages for `tailguard doctor` (repeatable)"),
    host_metrics: list[str] = typer.Option([], "--host-metrics", help="A node-exporter (e.g. http://node:9100), "
                                           "scraped with --scrape's pages for `tailguard doctor` (repeatable)"),
    scrape_interval: float = typer.Option(1.0, help="Wall seconds between --scrape snapshots"),
    workers: int = typer.Option(1, "--workers", min=1, help="Open loop over N processes: one schedule, one clock "
                                "origin, merged results, each worker's dispatch lag checked (no progress bar)"),
    find_capacity: Optional[str] = typer.Option(
        None, "--find-capacity", metavar="CLASS", help="Search the highest open-loop rate (from --rate) at which the "
        "workload's class CLASS meets its SLO for --capacity-share of its requests; writes capacity.json and each "
        "step's run under steps/"),
    capacity_slo: list[str] = typer.Option([], "--capacity-slo", metavar="KEY=SECONDS", help="The SLO --find-capacity "
                                           "holds CLASS to (ttft_s, tpot_s, e2e_s; repeatable; default: the workload "
                                           "class's `slo`)"),
    capacity_share: float = typer.Option(0.99, help="Share of CLASS's requests that must meet the SLO"),
    capacity_precision: float = typer.Option(0.05, help="Stop once the passing and failing rates are this close"),
) -> None:
    """Run a workload against an OpenAI-compatible server and write summary.json, requests.jsonl and report.html."""
    if ctx.invoked_subcommand is not None:
        return
    if not url:
        typer.echo(ctx.get_help())
        _fail("--url is required to run a benchmark")
    from tailguard.bench.load import BenchConfig, Timeouts
    from tailguard.bench.workload import parse_length
    from tailguard.errors import ConfigError, TargetError

    _check_choices(arrival, endpoint)
    if trace is None and (trace_format or window or limit is not None or rules or speed != 1.0):
        _fail("--trace-format, --speed, --window, --limit and --rules go with --trace FILE")
    try:
        warm_n, warm_s = parse_warmup(warmup)
        lengths = input_tokens is not None or output_tokens is not None
        spec = _trace_spec(trace, trace_format, speed, window, limit, rules, ignore_eos, workload)
        config = BenchConfig(
            url=url[0], extra_urls=tuple(url[1:]), workload=workload or ("fixed-lengths" if lengths else "seed-mixed"),
            concurrency=concurrency, rate=rate, arrival=arrival,  # type: ignore[arg-type]
            burstiness=burstiness,
            requests=requests if requests is not None or duration is not None or spec is not None else 200,
            duration_s=duration, warmup_requests=warm_n, warmup_s=warm_s, seed=seed, model=model, api_key=api_key,
            timeouts=Timeouts(connect_s=connect_timeout, first_token_s=first_token_timeout, total_s=timeout),
            max_dispatch_lag_s=max_dispatch_lag_ms / 1000.0, time_scale=time_scale, interrupt_grace_s=interrupt_grace,
            workers=workers,
            endpoint=endpoint,  # type: ignore[arg-type]
            trace=spec,
            input_tokens=None if input_tokens is None else parse_length(input_tokens, "--input-tokens"),
            output_tokens=None if output_tokens is None else parse_length(output_tokens, "--output-tokens"),
            ignore_eos=ignore_eos,
        )
        if find_capacity is not None:
            code = _search_capacity(config, out, find_capacity, capacity_slo, capacity_share, capacity_precision)
        else:
            code = _measure(config, out, not quiet, scrape, scrape_interval, {"gpu": gpu_metrics, "host": host_metrics})
    except (ConfigError, TargetError) as e:
        _fail(str(e))
    if code:
        raise typer.Exit(code)


def _check_choices(arrival: str, endpoint: str | None) -> None:
    """The flags that name one of a few choices, checked before anything is read."""
    from tailguard.bench.workload import ENDPOINTS

    if arrival not in ("constant", "poisson", "gamma"):
        _fail(f"--arrival must be constant, poisson or gamma, not {arrival!r}")
    if endpoint is not None and endpoint not in ENDPOINTS:
        _fail(f"--endpoint must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}")


def _trace_spec(trace: Path | None, trace_format: str | None, speed: float, window: str | None, limit: int | None,
                rules: Path | None, ignore_eos: bool | None, workload: str | None) -> "TraceSpec | None":
    """`--trace` and its flags as the run replays them (ignore_eos on unless said); None without one."""
    from tailguard.bench.trace.plan import TraceSpec
    from tailguard.errors import ConfigError

    if trace is None:
        return None
    if workload is not None:
        raise ConfigError("--trace replays the trace's own requests: --workload does not apply")
    return TraceSpec(str(trace), trace_format, speed, window, limit, None if rules is None else str(rules),
                     True if ignore_eos is None else ignore_eos)


def _search_capacity(config: "BenchConfig", out: Path, cls: str, slo: list[str], share: float,
                     precision: float) -> int:
    """`--find-capacity CLASS`: the search from `--rate`, each step a run of its own."""
    if config.rate is None:
        _fail("--find-capacity searches open-loop rates: give the first to try with --rate")
    return run_async(run_capacity(config, out, console(), cls, dict(parse_slo(s) for s in slo), share, precision))


def _measure(config: "BenchConfig", out: Path, progress: bool, scrape: list[str], interval_s: float,
             exporters: dict[str, list[str]]) -> int:
    """One run into `out`, interruptible, with the pages `--scrape` names snapshotted beside it."""
    from tailguard.bench.scrape import while_scraping

    return run_async(while_scraping(run_interruptible(config, out, console(), progress=progress),
                                    scrape, interval_s, out, exporters))


async def run_interruptible(config: "BenchConfig", out: Path, con: "Console", *, progress: bool) -> int:
    """Run and write the folder; the first SIGINT or SIGTERM stops the run early (the folder is
    still written, marked interrupted), a second one ends the process at once. Returns the exit
    code: 0, or 128 + the signal's number after an interrupt, as a shell reports a killed command."""
    import asyncio
    import signal

    from tailguard.bench.report import bench_to_dir

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    caught: list[signal.Signals] = []
    signals = (signal.SIGINT, signal.SIGTERM)

    def on_signal(sig: signal.Signals) -> None:
        caught.append(sig)
        stop.set()
        for s in signals:
            loop.remove_signal_handler(s)
            signal.signal(s, signal.SIG_DFL)  # the next one ends the process, with no clean-up
        con.print(f"[bold yellow]{sig.name}[/]: stopped sending; requests in flight get "
                  f"{config.interrupt_grace_s:g} s to finish (send it again to quit at once)", soft_wrap=True)

    for s in signals:
        loop.add_signal_handler(s, on_signal, s)
    try:
        await bench_to_dir(config, out, console=con, progress=progress, stop=stop)
    finally:
        if not caught:
            for s in signals:
                loop.remove_signal_handler(s)
    return 128 + caught[0].value if caught else 0


def parse_slo(text: str) -> tuple[str, float]:
    """`ttft_s=1.0` -> ("ttft_s", 1.0); a key that is not a target, or a value that is not a
    positive number, is an error."""
    from tailguard.errors import ConfigError

    key, sep, value = text.partition("=")
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not sep or key not in ("ttft_s", "tpot_s", "e2e_s") or not seconds > 0:
        raise ConfigError(f"--capacity-slo takes ttft_s, tpot_s or e2e_s = a positive number of seconds, got {text!r}")
    return key, seconds


async def run_capacity(config: "BenchConfig", out: Path, con: "Console", cls: str, slo: dict[str, float],
                       share: float, precision: float) -> int:
    """`--find-capacity`: each step a run of the workload open loop at the search's rate (its folder
    under out/steps/), judged on `cls`'s requests; out/ gets capacity.json and the files of the run
    at the capacity found. Exit code 1 when no rate met the SLO."""
    import json
    import shutil

    from tailguard.bench.capacity import CAPACITY_JSON, CapacitySearch

    assert config.rate is not None
    search = CapacitySearch(config.rate, precision)
    best: Path | None = None
    while (rate := search.next_rate()) is not None:
        step = out / "steps" / f"{len(search.steps):02d}-rate-{rate:.4g}"
        if await _capacity_step(search, config, rate, step, con, cls, slo, share):
            best = step
    result = {"class": cls, "slo": slo or None, "share": share, "precision": precision, **search.result()}
    out.mkdir(parents=True, exist_ok=True)
    (out / CAPACITY_JSON).write_text(json.dumps(result, indent=2) + "\n")
    if best is not None:
        for f in best.iterdir():
            if f.is_file():
                shutil.copy2(f, out / f.name)
    lo, hi = result["bracket"]
    con.print(f"capacity at the SLO: {lo or 0:.4g}/s (failing at {'-' if hi is None else f'{hi:.4g}'}/s); "
              f"{result['stopped']}; wrote {out}/{CAPACITY_JSON}", soft_wrap=True)
    return 0 if lo else 1


async def _capacity_step(search: "CapacitySearch", config: "BenchConfig", rate: float, step: Path, con: "Console",
                         cls: str, slo: dict[str, float], share: float) -> bool:
    """One step of the search: the run at `rate` into `step`, judged on `cls`'s requests and told
    to the search; True when it is the highest passing run so far."""
    import dataclasses

    from tailguard.bench.capacity import judge
    from tailguard.bench.report import bench_to_dir, load_run
    from tailguard.errors import ConfigError

    summary = await bench_to_dir(dataclasses.replace(config, rate=rate), step, console=con, progress=False,
                                 tables=False)
    records, meta = load_run(step)
    target = slo or (meta.get("slo") or {}).get(cls)
    if not target:
        raise ConfigError(f"class {cls!r} has no SLO in the workload: give one with --capacity-slo ttft_s=1.0")
    met = judge(records, cls, target)
    if met is None:
        sent = sorted({r.cls for r in records})
        raise ConfigError(f"the run sent no request of class {cls!r}: --find-capacity names one of the "
                          f"workload's classes ({', '.join(sent)})")
    validity = summary.get("validity") or {}
    valid = bool(validity.get("valid", True))
    passed = met >= share
    search.add(rate, passed, valid, met, None if valid else
               f"dispatch lag P99 {1000 * float(validity.get('dispatch_lag_p99_s', 0)):.1f} ms")
    con.print(f"{rate:.4g}/s: {100 * met:.2f}% of {cls} within {target} "
              f"({'pass' if passed else 'fail'}{'' if valid else ', not valid'})", soft_wrap=True)
    return passed and rate == search.passing()  # the highest passing run so far


def bench_compare(
    before: Path = typer.Argument(..., help="Output folder of the run before the change"),
    after: Path = typer.Argument(..., help="Output folder of the run after the change"),
    out: Optional[Path] = typer.Option(None, help="Where to write compare.json and compare.html (default: AFTER)"),
) -> None:
    """Side-by-side table and compare.html: ratios with bootstrap 95% CIs, and the verdict."""
    from tailguard.bench.report import compare_dirs
    from tailguard.errors import ConfigError

    try:
        compare_dirs(before, after, out, console=console())
    except ConfigError as e:
        _fail(str(e))


def bench_report(run_dir: Path = typer.Argument(..., help="A bench output folder")) -> None:
    """Rebuild summary.json and report.html from the folder's saved requests.jsonl."""
    from tailguard.bench.report import rerender
    from tailguard.errors import ConfigError

    try:
        rerender(run_dir, console=console())
    except ConfigError as e:
        _fail(str(e))


def bench_workloads(name: Optional[str] = typer.Argument(None, help="Print this built-in as YAML")) -> None:
    """List the built-in workloads, or print one as a YAML file to start your own from."""
    from tailguard.bench.workload import BUILTIN_WORKLOADS, load_workload, workload_yaml
    from tailguard.errors import ConfigError

    if name is None:
        for key, w in BUILTIN_WORKLOADS.items():
            typer.echo(f"{key:14} {w.get('description', '')}")
        return
    try:
        typer.echo(workload_yaml(load_workload(name)[0]), nl=False)
    except ConfigError as e:
        _fail(str(e))


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Measure tail latency honestly; compare two runs.", add_completion=False,
                        rich_markup_mode=None)
    bench.callback(invoke_without_command=True)(bench_run)
    bench.command("compare")(bench_compare)
    bench.command("report")(bench_report)
    bench.command("workloads")(bench_workloads)
    app.add_typer(bench, name="bench")
