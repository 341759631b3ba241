"""`tailguard top URL`: a live view of a running gateway, refreshed each second: per class its
queue, admitted and rejected per second and TTFT over the last minute; per backend its load over
its cap, health, kind and the engine's own counts; the busiest callers; with `--gpu-metrics URL`
(a DCGM exporter, or a `tailguard sim`), a line per GPU. It reads /metrics and /health only, so it
works against any gateway it can reach, and never changes anything.

A gateway with keys guards /metrics (`auth.admin_keys`, `auth.open_metrics`): the admin key is
sent as a Bearer token (`--api-key` or `TAILGUARD_API_KEY`). A 401 or 403 is said as what it is,
with what to do, and ends the command: no retry turns a refused key into an accepted one."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tailguard.doctor.window import Window

REFRESH_S = 1.0
FETCH_TIMEOUT_S = 2.0
TOP_CALLERS = 5


class Refused(Exception):
    """The gateway answered 401 or 403: the key is missing, wrong or not an admin key."""


def _refusal(status: int, key: str | None) -> str:
    """What a 401 or 403 on /metrics means, and what to do."""
    if status == 403:
        return ("GET /metrics answered 403: the key given is a client key; /metrics needs an admin key "
                "(auth.admin_keys)")
    if key is None:
        return ("GET /metrics answered 401: this gateway needs an admin key for /metrics; give it with --api-key "
                "KEY or TAILGUARD_API_KEY (or set auth.open_metrics)")
    return "GET /metrics answered 401: the gateway does not accept the key given (--api-key or TAILGUARD_API_KEY)"


def _get(url: str, key: str | None = None) -> tuple[int, bytes]:
    """One GET, bounded in time; an error status is an answer (a 503 /health still has a body)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as r:
            return r.status, r.read(4 << 20)
    except urllib.error.HTTPError as e:
        return e.code, e.read(4 << 20)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s"


def _gpu_lines(pages: dict[str, str | None]) -> list[str]:
    """One line per GPU on each DCGM page (None: the page could not be read), as of its last read."""
    from tailguard.doctor.hardware import gpus_of, models_of, page_name
    from tailguard.doctor.metrics import parse
    from tailguard.wire import dcgm

    lines = []
    for url, text in pages.items():
        if text is None:
            lines.append(f"GPU {page_name(url)}: unreachable")
            continue
        samples = parse(text)
        models = models_of(samples, page_name(url))
        for name, g in sorted(gpus_of(samples, page_name(url)).items()):
            parts = [f"GPU {name}" + (f" ({models[name]})" if name in models else "") + ":"]
            if dcgm.GPU_UTIL in g:
                parts.append(f"util {g[dcgm.GPU_UTIL]:.0f}%")
            if dcgm.SM_ACTIVE in g:
                parts.append(f"SM {g[dcgm.SM_ACTIVE] * 100:.0f}%")
            if dcgm.FB_USED in g and dcgm.FB_FREE in g:
                parts.append(f"mem {g[dcgm.FB_USED] / 1024:.1f}/{(g[dcgm.FB_USED] + g[dcgm.FB_FREE]) / 1024:.1f} GiB")
            if dcgm.POWER_USAGE in g:
                limit = f"/{g[dcgm.POWER_LIMIT]:.0f}" if dcgm.POWER_LIMIT in g else ""
                parts.append(f"{g[dcgm.POWER_USAGE]:.0f}{limit} W")
            if dcgm.SM_CLOCK in g:
                ceiling = f"/{g[dcgm.MAX_SM_CLOCK]:.0f}" if dcgm.MAX_SM_CLOCK in g else ""
                parts.append(f"{g[dcgm.SM_CLOCK]:.0f}{ceiling} MHz")
            lines.append("  ".join(parts))
    return lines


def _view(url: str, window: Window, health: dict[str, Any], gpus: dict[str, str | None]) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    w = window
    status = health.get("status", "?")
    style = {"ok": "green", "degraded": "yellow"}.get(status, "red")
    config = health.get("config") or {}
    head = Text.assemble(("tailguard top ", "bold"), url, "  ", (status, style),
                         f"  config {config.get('hash', '?')}  queued {health.get('queued', 0)}")

    classes = Table(title="classes (rates over the last minute)", title_justify="left", expand=False)
    for col in ("class", "queue", "admitted/s", "rejected/s", "TTFT P50", "TTFT P99"):
        classes.add_column(col, justify="left" if col == "class" else "right")
    queue = w.gauge("tailguard_queue_length", "class")
    admitted = w.rate("tailguard_requests_total", "class", exclude={"outcome": "rejected"})
    rejected = w.rate("tailguard_rejected_total", "class")
    p50 = w.quantile("tailguard_ttft_seconds", 0.5, "class")
    p99 = w.quantile("tailguard_ttft_seconds", 0.99, "class")
    for cls in sorted(set(queue) | set(admitted)):
        classes.add_row(cls, f"{queue.get(cls, 0):.0f}", f"{admitted.get(cls, 0.0):.1f}",
                        f"{rejected.get(cls, 0.0):.1f}", _ms(p50.get(cls)), _ms(p99.get(cls)))

    backends = Table(title="backends", title_justify="left")
    for col in ("backend", "kind", "health", "in flight", "engine run/wait"):
        backends.add_column(col, justify="right" if col in ("in flight", "engine run/wait") else "left")
    for name, b in sorted((health.get("backends") or {}).items()):
        engine = b.get("engine")
        state = b.get("state", "?")
        backends.add_row(name, b.get("kind", "?"), Text(state, "green" if state == "healthy" else "yellow"),
                         f"{b.get('in_flight', 0)}/{b.get('max_concurrency', 0)}",
                         f"{engine['running']}/{engine['waiting']}" if engine else "-")

    from tailguard.doctor.window import top

    callers = Table(title="top callers", title_justify="left")
    for col in ("caller", "requests/s", "tokens/s"):
        callers.add_column(col, justify="left" if col == "caller" else "right")
    tokens = w.rate("tailguard_caller_tokens_total", "caller")
    for caller, rate in top(w.rate("tailguard_caller_requests_total", "caller"), TOP_CALLERS):
        callers.add_row(caller, f"{rate:.1f}", f"{tokens.get(caller, 0.0):.0f}")
    parts: list[RenderableType] = [head, classes, backends]
    if callers.row_count:
        parts.append(callers)
    parts.extend(Text(line) for line in _gpu_lines(gpus))
    parts.append(Text("Ctrl-C to quit", "dim"))
    return Group(*parts)


def _unreachable(url: str, error: str) -> RenderableType:
    from rich.text import Text

    return Text.assemble(("tailguard top ", "bold"), url, "\n", (f"gateway unreachable: {error}", "bold red"),
                         f"\ntrying again every {REFRESH_S:g} s; Ctrl-C to quit")


def _gpu_pages(urls: list[str]) -> dict[str, str | None]:
    """Each DCGM page's text now (None when it cannot be read: the GPU line says so)."""
    from tailguard.bench.scrape import metrics_url

    out: dict[str, str | None] = {}
    for u in urls:
        try:
            status, page = _get(metrics_url(u))
            out[u] = page.decode("utf-8", "replace") if status == 200 else None
        except OSError:
            out[u] = None
    return out


def _frame(url: str, window: Window, gpu_urls: list[str], key: str | None = None) -> RenderableType:
    """One refresh: fetch the gateway's pages (and the GPUs'), fold /metrics into the window,
    draw. Raises `Refused` on a 401 or 403."""
    import json

    from tailguard.doctor.metrics import parse

    try:
        status, page = _get(f"{url}/metrics", key)
        if status in (401, 403):
            raise Refused(_refusal(status, key))
        if status != 200:
            return _unreachable(url, f"GET /metrics answered {status}")
        window.add(time.monotonic(), parse(page.decode("utf-8", "replace")))
        _, body = _get(f"{url}/health")
        health = json.loads(body)
    except (OSError, ValueError) as e:
        return _unreachable(url, str(getattr(e, "reason", None) or e))
    return _view(url, window, health if isinstance(health, dict) else {}, _gpu_pages(gpu_urls))


def top_cmd(
    url: str = typer.Argument(..., help="The gateway's base URL, e.g. http://127.0.0.1:8080"),
    gpu_metrics: list[str] = typer.Option([], "--gpu-metrics", help="A DCGM exporter (or a tailguard sim): a line per "
                                          "GPU on its page (repeatable)"),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="TAILGUARD_API_KEY", show_envvar=False,
        help="An admin key (auth.admin_keys), sent as a Bearer token for /metrics (env TAILGUARD_API_KEY)."),
) -> None:
    """Watch a running gateway: classes, backends and callers (and GPUs), refreshed each second."""
    from rich.console import Console
    from rich.live import Live

    from tailguard.doctor.window import Window

    url = url.rstrip("/")
    window = Window(span_s=60.0)
    console = Console()
    try:
        with Live(_frame(url, window, gpu_metrics, api_key), console=console, refresh_per_second=4,
                  transient=False) as live:
            while True:
                time.sleep(REFRESH_S)
                live.update(_frame(url, window, gpu_metrics, api_key))
    except KeyboardInterrupt:
        pass  # Ctrl-C is how one leaves: no traceback, exit 0
    except Refused as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    app.command("top")(top_cmd)
