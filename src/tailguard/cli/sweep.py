"""`tailguard sweep`: move one setting over a list or range, each value measured (with repeats
until its P99 settles) against the discrete-event simulator (seconds for a whole sweep, seeded and
reproducible), the simulator over HTTP behind a real gateway process, or a real engine behind a
gateway restarted per value; writes every run, sweep.json, sweep.html and pareto.png."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from tailguard.bench.trace.plan import TraceSpec
    from tailguard.sweep.search import Setting, Sweep

ENGINE = "engine"


@dataclass(frozen=True)
class Plan:
    """What every run of the sweep shares; the setting's value goes on top of it."""

    workload: str
    requests: int
    concurrency: int | None
    rate: float | None
    gateway: dict[str, Any]  # base gateway YAML settings, backends included
    preset: str
    max_num_seqs: int
    time_scale: float | None  # wall seconds per simulated second of the simulator measured, if it is one
    out: Path
    trace: "TraceSpec | None" = None  # replayed instead of the workload: its arrivals and sizes

    @property
    def sim_time_scale(self) -> float:
        return 0.25 if self.time_scale is None else self.time_scale


@dataclass
class SweepProgress:
    """One line on stderr per run: the value, and about how long is left (the runs still needed
    at the least, at the mean time of a run so far), so a sweep of minutes is not silent."""

    sw: "Sweep"
    started: float = field(default_factory=time.monotonic)
    runs: int = 0

    def done(self, index: int, seed: int) -> None:
        self.runs += 1
        took = time.monotonic() - self.started
        left_s = self.sw.runs_left() * took / self.runs
        typer.echo(f"[{index + 1}/{len(self.sw.values)}] {self.sw.setting.label}={self.sw.values[index]} seed {seed} "
                   f"measured; {self.runs} runs in {took:.1f} s, about {left_s:.0f} s left", err=True)


def _folder(sw: "Sweep", value: Any, seed: int, out: Path) -> Path:
    return out / f"{sw.setting.label.replace(':', '-')}={value}" / f"seed{seed}"


def run_des(sw: "Sweep", plan: Plan) -> None:
    """Every run on virtual time, in this process."""
    from tailguard.bench.load import RunResult
    from tailguard.bench.report import write_outputs
    from tailguard.bench.workload import load_workload
    from tailguard.config import GatewayConfig
    from tailguard.sim.cost import EngineConfig
    from tailguard.sweep.search import apply
    from tailguard.sweep.virtual import VirtualRun, run_virtual

    from tailguard.bench.trace.plan import load_replay

    replay = load_replay(plan.trace) if plan.trace is not None else None
    workload = None if replay is not None else load_workload(plan.workload)[0]
    progress = SweepProgress(sw)
    while (nxt := sw.next_run()) is not None:
        i, value, seed = nxt
        gw, eng = apply(sw.setting, value, plan.gateway, {"max_num_seqs": plan.max_num_seqs})
        engine, gateway = EngineConfig.from_preset(plan.preset, **eng), GatewayConfig.model_validate(gw)
        if replay is not None:
            vr = VirtualRun.of_trace(engine, replay, gateway, seed)
        else:
            assert workload is not None
            vr = VirtualRun(engine, workload, plan.requests, gateway, plan.concurrency, plan.rate, seed)
        records, meta, _ = run_virtual(vr)
        meta["label"] = f"{sw.setting.label}={value}"
        sw.add(i, write_outputs(RunResult(records, meta), _folder(sw, value, seed, plan.out), html=False))
        progress.done(i, seed)


@contextlib.asynccontextmanager
async def _gateway_for(gw: dict[str, Any], sim_extra: dict[str, Any], plan: Plan, backend: str | None,
                       label: str) -> AsyncIterator[str]:
    """A fresh gateway (and simulator, without `backend`) for one value; yields the gateway's URL."""
    import yaml

    from tailguard.cli.experiment import Arm, SimSpec, free_port, spawned, target

    logs = plan.out / "logs"
    mc = int(gw["backends"][0]["max_concurrency"])
    rest = {k: v for k, v in gw.items() if k != "backends"}
    if backend is None:
        extra = () if "enable_prefix_caching" not in sim_extra else (
            ("--enable-prefix-caching",) if sim_extra["enable_prefix_caching"] else ("--no-enable-prefix-caching",))
        sim = SimSpec(plan.preset, int(sim_extra.get("max_num_seqs", plan.max_num_seqs)), plan.sim_time_scale, extra)
        arm = Arm(label, gateway=True, policy=rest.get("scheduler", {}).get("policy", "ranked-sjf"),
                  max_concurrency=mc, config=rest)
        async with target(arm, sim, logs) as url:
            yield url
        return
    port = free_port()
    path = logs / f"{Arm(label).folder}-gateway.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**rest, "backends": [{**gw["backends"][0], "url": backend}]}))
    url = f"http://127.0.0.1:{port}"
    async with spawned(["serve", "--port", str(port), "--config", str(path)], f"{url}/health",
                       logs / f"{Arm(label).folder}-gateway.log"):
        yield url


async def run_http(sw: "Sweep", plan: Plan, backend: str | None) -> None:
    """Per value, a gateway process (and a simulator process, without `backend`); its repeats run
    against them with the bench."""
    from tailguard.bench.load import BenchConfig
    from tailguard.bench.report import bench_to_dir
    from tailguard.sweep.search import apply

    progress = SweepProgress(sw)
    while (nxt := sw.next_run()) is not None:
        i, value, _ = nxt
        gw, eng = apply(sw.setting, value, plan.gateway, {"max_num_seqs": plan.max_num_seqs})
        label = f"{sw.setting.label}={value}"
        async with _gateway_for(gw, eng, plan, backend, label) as url:
            while (nxt := sw.next_run()) is not None and nxt[0] == i:
                seed = nxt[2]
                traced = plan.trace is not None
                cfg = BenchConfig(url=url, workload=plan.workload, concurrency=plan.concurrency, rate=plan.rate,
                                  requests=None if traced else plan.requests, seed=seed, trace=plan.trace,
                                  time_scale=plan.sim_time_scale if backend is None else plan.time_scale)
                sw.add(i, await bench_to_dir(cfg, _folder(sw, value, seed, plan.out), console=None, label=label))
                progress.done(i, seed)


def _base_gateway(config: Path | None, backend_kind: str, max_concurrency: int, fleet: bool) -> dict[str, Any]:
    """The config's settings over one engine; with `fleet` (the DES), over the backends the config
    names when it names several, each a simulated engine (its max_concurrency by default the
    engine's slots)."""
    import yaml

    base: dict[str, Any] = yaml.safe_load(config.read_text()) if config is not None else {}
    base = base or {}
    named = base.get("backends") or []
    if fleet and len(named) > 1:
        base["backends"] = [{"max_concurrency": max_concurrency, **b} for b in named]
    else:
        base["backends"] = [{"name": ENGINE, "url": "http://127.0.0.1:1", "kind": backend_kind,
                             "max_concurrency": max_concurrency}]
    return base


def _check(setting: "Setting", backend: str | None, target: str) -> None:
    from tailguard.errors import ConfigError

    if target not in ("des", "sim"):
        raise ConfigError(f"--target {target!r}: des (virtual time) or sim (HTTP simulator); or give --backend URL")
    if backend is not None and setting.on_engine:
        raise ConfigError(f"{setting.name} is the engine's: a sweep against a real --backend moves gateway settings only")


def sweep(
    setting: str = typer.Option(..., help="max_concurrency, max_tokens_cap:CLASS, policy, aging_s, preemption, "
                                          "fair_share; "
                                          "on the simulator also max_num_seqs, prefix_caching"),
    values: str = typer.Option(..., help="2..32, 2..32:x2, 1,5,10, on,off or policy names"),
    slo: list[str] = typer.Option([], help="CLASS:METRIC=SECONDS on the class's P99, e.g. chat:e2e_s=1.5 (repeatable)"),
    target: str = typer.Option("des", help="des: the discrete-event simulator; sim: the HTTP simulator behind a gateway"),
    backend: Optional[str] = typer.Option(None, help="A real engine's URL: a gateway in front, restarted per value"),
    backend_kind: str = typer.Option("vllm", help="The --backend's kind (vllm, sglang, llamacpp, tgi, openai)"),
    config: Optional[Path] = typer.Option(None, help="Gateway YAML the sweep starts from (classes, scheduler; on "
                                                     "--target des, its backends: several are a simulated fleet)"),
    workload: str = typer.Option("seed-mixed", help="Built-in workload name or a YAML file"),
    concurrency: Optional[int] = typer.Option(None, help="Closed loop: N clients"),
    rate: Optional[float] = typer.Option(None, help="Open loop: requests per second (wall seconds over HTTP)"),
    requests: Optional[int] = typer.Option(None, help="Requests per run (default 400)"),
    trace: Optional[Path] = typer.Option(None, help="Replay this trace's arrivals and sizes in every run instead of "
                                         "a workload (formats: `tailguard bench --help`)"),
    trace_format: Optional[str] = typer.Option(None, help="With --trace: azure, burstgpt, mooncake or tailguard"),
    speed: float = typer.Option(1.0, help="With --trace: X times the trace's rate"),
    window: Optional[str] = typer.Option(None, help="With --trace: START:DURATION of it, in its seconds"),
    limit: Optional[int] = typer.Option(None, help="With --trace: its first N requests"),
    rules: Optional[Path] = typer.Option(None, help="With --trace: the rule file mapping its fields to classes"),
    seed: int = typer.Option(0, help="Seed of a value's first run; repeats take the next seeds"),
    min_repeats: int = typer.Option(2, help="Runs per value at least"),
    max_repeats: int = typer.Option(5, help="Runs per value at most"),
    tolerance: float = typer.Option(0.1, help="Repeat until the P99's 95% interval is within this fraction of its mean"),
    preset: str = typer.Option("h100-llama8b", help="Simulated engine preset"),
    max_num_seqs: int = typer.Option(8, help="Simulated engine's slots; also the gateway's max_concurrency unless swept"),
    time_scale: Optional[float] = typer.Option(None, help="Wall seconds per simulated second: --target sim's "
                                                "(default 0.25), or a --backend that is `tailguard sim`'s"),
    out: Path = typer.Option(Path("sweep-out"), help="Output folder"),
) -> None:
    """Move one setting at a time against a per-class P99 SLO; recommend a value and show the knee."""
    from tailguard.cli.bench import _fail, console
    from tailguard.errors import ConfigError
    from tailguard.sweep.search import Setting, Slo, Sweep, parse_values, result

    try:
        st = Setting.parse(setting)
        _check(st, backend, target)
        spec = _trace_spec(trace, trace_format, speed, window, limit, rules, (concurrency, rate, requests))
        sw = Sweep(st, parse_values(st, values), [Slo.parse(s) for s in slo], seed, min_repeats, max_repeats, tolerance,
                   clients=concurrency)
        for warning in result(sw)["warnings"]:
            typer.echo(f"warning: {warning}", err=True)
        kind = backend_kind if backend is not None else "sim"
        des = backend is None and target == "des"
        plan = Plan(workload, requests or 400, concurrency, rate, _base_gateway(config, kind, max_num_seqs, des),
                    preset, max_num_seqs, time_scale, out, spec)
        how = _measure(sw, plan, backend, des)
    except ConfigError as e:
        _fail(str(e))
    res = result(sw)
    if spec is not None:
        res["how"] = how + f" Trace {trace}" + "".join(
            f", {name} {v}" for name, v in (("window", window), ("first", limit)) if v is not None) + (
            f", at {speed:g}x its rate." if speed != 1.0 else ".")
    else:
        res["how"] = how + f" Workload {workload}, {requests or 400} requests per run, " + (
            f"{concurrency} clients." if concurrency is not None else f"{rate} req/s.")
    _write(res, out)
    _print(res, console())


def _trace_spec(trace: Path | None, trace_format: str | None, speed: float, window: str | None, limit: int | None,
                rules: Path | None, load: tuple[int | None, float | None, int | None]) -> "TraceSpec | None":
    """`--trace` and its flags as every run replays them, or None without one; the load flags
    (`--concurrency`, `--rate`, `--requests`) go with a workload, exactly one of the first two."""
    from tailguard.bench.trace.plan import TraceSpec
    from tailguard.errors import ConfigError

    spec = None if trace is None else TraceSpec(str(trace), trace_format, speed, window, limit,
                                                None if rules is None else str(rules))
    concurrency, rate, _ = load
    if spec is not None and load != (None, None, None):
        raise ConfigError("--trace sets every run's arrivals and length: --concurrency, --rate and --requests "
                          "do not apply (--speed, --window and --limit do)")
    if spec is None and (trace_format or window or limit is not None or rules or speed != 1.0):
        raise ConfigError("--trace-format, --speed, --window, --limit and --rules go with --trace FILE")
    if spec is None and (concurrency is None) == (rate is None):
        raise ConfigError("give one of --concurrency N (a closed loop of N clients) or --rate R (open loop, "
                          "requests per second), or --trace FILE")
    return spec


def _measure(sw: "Sweep", plan: Plan, backend: str | None, des: bool) -> str:
    """Every run of the sweep, on the DES or over HTTP; what they ran against, in a sentence."""
    from tailguard.cli.bench import run_async

    if des:
        run_des(sw, plan)
        engines = len(plan.gateway["backends"])
        fleet = f", a fleet of {engines} engines as the config names them" if engines > 1 else ""
        return f"On the discrete-event simulator ({plan.preset}, max_num_seqs {plan.max_num_seqs}{fleet}), virtual time."
    run_async(run_http(sw, plan, backend))
    if backend is not None:
        return f"Against {backend} behind a gateway restarted per value."
    return (f"Against the HTTP simulator ({plan.preset}, time scale {plan.sim_time_scale:g}) behind a gateway, "
            "both restarted per value.")


def _write(res: dict[str, Any], out: Path) -> None:
    """sweep.json, sweep.html and pareto.png into `out`."""
    import orjson

    from tailguard.sweep.page import render

    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2) + b"\n")
    page, pareto = render(res, res["how"])
    (out / "sweep.html").write_text(page, encoding="utf-8")
    (out / "pareto.png").write_bytes(pareto)


def _columns(res: dict[str, Any]) -> list[tuple[str, str]]:
    """(class, metric) of each P99 column: every class's E2E, and beside it what an SLO judges."""
    classes = sorted({c for p in res["points"] for c in p["p99"]})
    judged = [(s["cls"], s["metric"]) for s in res["slo"] if s["metric"] != "e2e_s"]
    return [col for c in classes for col in [(c, "e2e_s"), *[j for j in judged if j[0] == c]]]


def _print(res: dict[str, Any], con: Any) -> None:
    from rich.table import Table

    t = Table(title=f"sweep of {res['setting']}: P99 in seconds, output tokens/s")
    cols = _columns(res)
    for col in ["value", "runs", "tokens/s", *[f"{c} P99 {m.removesuffix('_s').upper()} (s)" for c, m in cols], "SLO"]:
        t.add_column(col, justify="right")
    for p in res["points"]:
        cells = [f"{(p['p99'].get(c, {}).get(m, {}).get('mean') or float('nan')):.3f}" for c, m in cols]
        t.add_row(str(p["value"]), str(p["runs"]), f"{p['throughput_tokens_per_s']:.0f}", *cells,
                  "ok" if p["meets_slo"] else "miss")
    con.print(t)
    con.print(f"{res['how']} Each figure is the mean over a value's runs.", soft_wrap=True)
    knee = f"knee: {res['knee']}" if res["knee"] is not None else f"no knee: {res['no_knee']}"
    con.print(f"{knee}; recommended: [bold]{res['recommended']}[/] ({res['reason']})")
    for warning in res["warnings"]:
        con.print(f"[yellow]warning:[/] {warning}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
