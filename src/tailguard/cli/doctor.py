"""`tailguard doctor RUN_DIR`: read a bench run (and the /metrics snapshots taken during it) and
say what is wrong, why, and the one change to try next. Writes doctor.json into the run folder
and rebuilds its report.html with a Doctor section."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from tailguard.bench.recorder import RequestRecord
    from tailguard.doctor.evidence import Samples


def _fetch_now(url: str) -> str:
    """One snapshot of a server's /metrics, taken now (for a run saved without --scrape)."""
    import asyncio

    import aiohttp

    from tailguard.bench.scrape import SCRAPE_TIMEOUT_S, metrics_url

    async def get() -> str:
        async with aiohttp.ClientSession() as s, asyncio.timeout(SCRAPE_TIMEOUT_S), s.get(metrics_url(url)) as r:
            return await r.text()

    return asyncio.run(get())


def snapshots(run_dir: Path, gateway_url: str | None, engine_url: str | None) -> tuple[list["Samples"], list["Samples"]]:
    """The run's saved pages, split into (gateway, engine): by the URL the user named, else by
    what the page holds (vllm:* is an engine, tailguard_requests_* the gateway). A named URL with
    no saved page is fetched once now."""
    from tailguard.bench.scrape import metrics_url, read_scrapes
    from tailguard.doctor.evidence import is_engine, is_gateway
    from tailguard.doctor.metrics import parse

    pages = {url: [parse(t) for t in texts] for url, texts in read_scrapes(run_dir).items()}
    for named in (gateway_url, engine_url):
        if named is not None and metrics_url(named) not in pages:
            pages[metrics_url(named)] = [parse(_fetch_now(named))]
    gw: list[Samples] = []
    eng: list[Samples] = []
    for url, snaps in pages.items():
        if not snaps:
            continue
        if engine_url is not None and url == metrics_url(engine_url):
            eng = snaps
        elif gateway_url is not None and url == metrics_url(gateway_url):
            gw = snaps
        elif is_engine(snaps[-1]) and not eng:
            eng = snaps
        elif is_gateway(snaps[-1]) and not gw:
            gw = snaps
    return gw, eng


def doctor(
    run_dir: Path = typer.Argument(..., help="A bench output folder"),
    gateway_metrics: Optional[str] = typer.Option(None, help="The gateway's URL (its /metrics, scraped or fetched now)"),
    engine_metrics: Optional[str] = typer.Option(None, help="The engine's URL (its /metrics, scraped or fetched now)"),
    json_out: bool = typer.Option(False, "--json", help='Print {"findings": [...]} for scripts'),
    against: Optional[Path] = typer.Option(
        None, "--against", help="An earlier run: say which gateway settings differ from it (warns when more than one)"),
) -> None:
    """Explain a measured run: findings with their evidence, the next change to try and the command that checks it."""
    import orjson

    from tailguard.bench.configs import config_lines
    from tailguard.bench.report import DOCTOR_FILE, load_run, rerender
    from tailguard.cli.bench import _fail, console
    from tailguard.doctor.diagnosis import diagnose
    from tailguard.doctor.evidence import engine_evidence, gateway_evidence
    from tailguard.doctor.rules import findings_json
    from tailguard.errors import ConfigError

    try:
        records, meta = load_run(run_dir)
    except ConfigError as e:
        _fail(str(e) + _runs_inside(run_dir))
    gw, eng = snapshots(run_dir, gateway_metrics, engine_metrics)
    found = diagnose(records, meta, engine=engine_evidence(eng), gateway=gateway_evidence(gw), run_dir=str(run_dir))
    out: dict[str, Any] = dict(findings_json(found))
    config = _config_since(against, records, meta)
    if config is not None:
        out["config"] = config
    (run_dir / DOCTOR_FILE).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    rerender(run_dir)
    if json_out:
        typer.echo(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return
    con = console()
    for line in config_lines(config):
        con.print(line, style="bold yellow" if line.startswith("warning") else None, soft_wrap=True)
    if not found:
        con.print("[bold green]no problem found[/]")
    for i, f in enumerate(found, 1):
        con.print(f"[bold]{i}. {f.kind}[/] ({f.severity}): {f.symptom}")
        con.print(f"   likely cause: {f.cause}")
        for line in f.evidence_for:
            con.print(f"   for: {line}")
        for line in f.evidence_against:
            con.print(f"   against: {line}")
        con.print(f"   next: {f.next_step}")
        con.print(f"   check: {f.check}", soft_wrap=True)
    con.print(f"wrote {run_dir / DOCTOR_FILE}; report.html has a Doctor section")


def _runs_inside(folder: Path) -> str:
    """A folder of runs (`runs/demo`: before/ and after/) named by what it holds, to pick from."""
    from tailguard.bench.report import REQUESTS_FILE

    inside = sorted(p.parent for p in folder.glob(f"*/{REQUESTS_FILE}")) if folder.is_dir() else []
    if not inside:
        return ""
    return (f"; it holds the runs {', '.join(str(p) for p in inside)}: e.g. tailguard doctor {inside[0]}")


def _config_since(against: Path | None, records: list[RequestRecord], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The gateway settings that differ from the run `against` (or, alone, a config that changed
    during this run), as `bench.configs.config_changes` says them."""
    from tailguard.bench.configs import config_changes, run_config, within_run
    from tailguard.bench.report import load_run
    from tailguard.cli.bench import _fail
    from tailguard.errors import ConfigError

    this = run_config(records, meta)
    if against is None:
        return within_run(this)
    try:
        other_records, other_meta = load_run(against)
    except ConfigError as e:
        _fail(str(e))
    return config_changes(run_config(other_records, other_meta), this, (f"the run {against}", "this run"))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
