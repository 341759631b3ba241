"""`tailguard doctor RUN_DIR`: read a bench run (and the /metrics snapshots taken during it) and
say what is wrong, why, and the one change to try next. Writes doctor.json into the run folder
and rebuilds its report.html with a Doctor section."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from tailguard.bench.recorder import RequestRecord
    from tailguard.doctor.pages import Pages


def _fetch_now(url: str) -> str:
    """One snapshot of a server's /metrics, taken now (for a run saved without --scrape)."""
    import asyncio

    import aiohttp

    from tailguard.bench.scrape import SCRAPE_TIMEOUT_S, metrics_url

    async def get() -> str:
        async with aiohttp.ClientSession() as s, asyncio.timeout(SCRAPE_TIMEOUT_S), s.get(metrics_url(url)) as r:
            return await r.text()

    return asyncio.run(get())


def snapshots(run_dir: Path, gateway_url: str | None = None, engine_url: str | None = None,
              gpu_urls: Sequence[str] = (), host_urls: Sequence[str] = ()) -> "Pages":
    """The run's saved pages, sorted into the gateway's, the engine's, GPUs' and hosts'
    (`doctor.pages.sort_pages`): by the URL the user named (here or to bench), else by what the
    page holds. A named URL with no saved page is fetched once now."""
    from tailguard.bench.scrape import metrics_url, read_scrapes
    from tailguard.doctor.metrics import parse
    from tailguard.doctor.pages import sort_pages

    pages = {url: (saved.role, [parse(t) for t in saved.texts]) for url, saved in read_scrapes(run_dir).items()}
    named = {**{u: None for u in (gateway_url, engine_url) if u is not None},
             **{u: "gpu" for u in gpu_urls}, **{u: "host" for u in host_urls}}
    for url, role in named.items():
        page = metrics_url(url)
        if page not in pages or not pages[page][1]:
            pages[page] = (role, [parse(_fetch_now(url))])
        elif role is not None:
            pages[page] = (role, pages[page][1])
    return sort_pages(pages, gateway_url and metrics_url(gateway_url), engine_url and metrics_url(engine_url))


def doctor(
    run_dir: Path = typer.Argument(..., help="A bench output folder"),
    gateway_metrics: Optional[str] = typer.Option(None, help="The gateway's URL (its /metrics, scraped or fetched now)"),
    engine_metrics: Optional[str] = typer.Option(None, help="The engine's URL (its /metrics, scraped or fetched now)"),
    gpu_metrics: list[str] = typer.Option([], "--gpu-metrics", help="A DCGM exporter's URL (scraped, or fetched now; "
                                          "repeatable)"),
    host_metrics: list[str] = typer.Option([], "--host-metrics", help="A node-exporter's URL (scraped, or fetched now; "
                                           "repeatable)"),
    json_out: bool = typer.Option(False, "--json", help='Print {"findings": [...]} for scripts'),
    against: Optional[Path] = typer.Option(
        None, "--against", help="An earlier run: say which gateway settings differ from it (warns when more than one), "
                                "and what the change cost (priority_cost)"),
) -> None:
    """Explain a measured run: findings with their evidence, the next change to try and the command that checks it."""
    import orjson

    from tailguard.bench.configs import config_lines
    from tailguard.bench.report import DOCTOR_FILE, load_run, rerender
    from tailguard.cli.bench import _fail, console
    from tailguard.doctor.diagnosis import diagnose
    from tailguard.doctor.pages import evidence
    from tailguard.doctor.rules import findings_json
    from tailguard.errors import ConfigError

    try:
        records, meta = load_run(run_dir)
    except ConfigError as e:
        _fail(str(e) + _runs_inside(run_dir))
    pages = snapshots(run_dir, gateway_metrics, engine_metrics, gpu_metrics, host_metrics)
    earlier = _earlier(against)
    found = diagnose(records, meta, evidence=evidence(pages), against=earlier, run_dir=str(run_dir))
    out: dict[str, Any] = dict(findings_json(found))
    config = _config_since(earlier, records, meta, against)
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


def _earlier(against: Path | None) -> tuple[list[RequestRecord], dict[str, Any]] | None:
    """The `--against` run's records and run.json."""
    from tailguard.bench.report import load_run
    from tailguard.cli.bench import _fail
    from tailguard.errors import ConfigError

    if against is None:
        return None
    try:
        return load_run(against)
    except ConfigError as e:
        _fail(str(e))


def _config_since(earlier: tuple[list[RequestRecord], dict[str, Any]] | None, records: list[RequestRecord],
                  meta: dict[str, Any], against: Path | None = None) -> dict[str, Any] | None:
    """The gateway settings that differ from the `earlier` run's (or, alone, a config that changed
    during this run), as `bench.configs.config_changes` says them."""
    from tailguard.bench.configs import config_changes, run_config, within_run

    this = run_config(records, meta)
    if earlier is None:
        return within_run(this)
    return config_changes(run_config(*earlier), this, (f"the run {against}", "this run"))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
