"""The dashboard and the alert rules against a real Prometheus: Debian's `prometheus` scrapes a real
gateway and simulator while `tailguard bench` loads them (and a preemption, a retry, a denied retry,
a caller's refusal and a stranger's 401 happen on purpose), then every panel's and every rule's
expression (and the autoscaling example's query) runs through Prometheus's HTTP API and must
return data. The panels are drawn to PNGs
(`make observe` keeps them in docs/observability/ for docs/observability.md)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml
from openai import AsyncOpenAI

from tailguard.config import BackendConfig
from tailguard.gateway.ops import alerts
from tailguard.gateway.ops.panels import PANELS, outside_grafana
from tests.cli import run
from tests.functional.gateways import classes, dead_url, gateway, sample, scrape
from tests.functional.panel_png import draw_row
from tests.functional.prometheus_tools import Prometheus, running_prometheus, tool

SCALE = 0.02
CHAT = [{"role": "user", "content": "hello " * 8}]
KEYS = {"sk-load": {"name": "load"}, "sk-limited": {"name": "limited", "rpm_limit": 1}}
CFG: dict[str, Any] = {
    "auth": {"api_keys": KEYS},
    "classes": classes(interactive={"slo": {"ttft_s": 2.0}}, batch={"preemptible": True, "max_share": 1.0}),
    "scheduler": {"min_run_s": 0.0},
    # One retry in the window, then none: the dead backend's next failure is a denied retry.
    "retries": {"budget_ratio": 0.0, "min_retries_per_s": 0.1},
    "health": {"unhealthy_after": 4},  # its first probe and three requests' connections
    # Every request's text checked (and flagged when it holds personal data), and audited.
    "guards": [{"name": "pii", "stage": "input", "check": "personal_data", "action": "flag"}],
}
WINDOW = "1m"  # stands for Grafana's $__rate_interval: covers the whole short run


async def _on_purpose(url: str) -> None:
    """A retry and a denied one (requests meet the dead backend until it is taken out), a
    preemption (two long batch streams hold both slots, then a chat arrives), a caller over its
    limit, and a request with no key."""
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-load", max_retries=0) as c:
        for _ in range(10):
            m = await scrape(url)
            if sample(m, "tailguard_backend_healthy", backend="dead") == 0:
                break
            try:
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
            except openai.InternalServerError:  # its retry denied: a 502
                pass
        assert sample(m, "tailguard_retries_total", backend="dead", kind="connect") == 1
        assert sample(m, "tailguard_retries_denied_total", backend="dead", kind="connect") >= 1
        batch = [await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3000, stream=True,
                                                 extra_headers={"X-Tailguard-Class": "batch"}) for _ in range(2)]

        async def drain(stream: Any) -> None:
            async for _ in stream:
                pass
        drains = [asyncio.create_task(drain(s)) for s in batch]
        await asyncio.sleep(0.2)
        await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=8)
        await asyncio.gather(*drains)
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-limited", max_retries=0) as limited:
        await limited.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
        with pytest.raises(openai.RateLimitError):
            await limited.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/chat/completions", json={}) as r:
        assert r.status == 401


def _keda_queries() -> list[str]:
    """The PromQL the worked autoscaling example scales on."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "keda" / "scaledobject.yaml").read_text())
    return [t["metadata"]["query"] for t in doc["spec"]["triggers"]]


async def _scraped_after(prom: Prometheus, job: str, more: int) -> None:
    """Wait until Prometheus has scraped `job` `more` times after now (bounded by the test's timeout)."""
    start = await asyncio.to_thread(prom.scrapes, job)
    while await asyncio.to_thread(prom.scrapes, job) < start + more:
        await asyncio.sleep(0.25)


async def test_every_panel_and_rule_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    tool("prometheus")
    dead = BackendConfig(name="dead", url=dead_url(), max_concurrency=2, models=["tailguard-sim"])
    audit = {"enabled": True, "path": str(tmp_path / "audit.sqlite3")}
    async with asyncio.timeout(90), gateway(max_concurrency=2, scale=SCALE, extra_backends=[dead], audit=audit,
                                            **CFG) as gw:
        targets = {"tailguard": gw.url.removeprefix("http://"), "sim": gw.sims[0].url.removeprefix("http://")}
        with running_prometheus(tmp_path, targets) as prom:
            await _scraped_after(prom, "tailguard", 1)
            started = time.time()  # Prometheus runs on this machine: the same clock
            await _on_purpose(gw.url)
            code, out = await run("bench", "--url", gw.url, "--workload", "seed-mixed", "--rate", "15",
                                  "--duration", "2", "--api-key", "sk-load", "--time-scale", str(SCALE),
                                  "--out", str(tmp_path / "bench"), "--quiet", limit_s=60)
            assert code == 0, out
            await _scraped_after(prom, "tailguard", 4)
            ended = time.time()
            empty = []
            series: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for p in PANELS:
                for i, q in enumerate(p.queries):
                    expr = outside_grafana(q.expr, WINDOW)
                    if not await asyncio.to_thread(prom.query, expr):
                        empty.append(f"{p.title}: {expr}")
                    series[(p.title, i)] = await asyncio.to_thread(prom.query_range, expr, started, ended, 0.5)
            for query in _keda_queries():
                if not await asyncio.to_thread(prom.query, query):
                    empty.append(f"deploy/keda: {query}")
            for rule in alerts.rules():
                await asyncio.to_thread(prom.query, rule.expr)  # parses and runs, whether it fires or not
                for signal in rule.signals:
                    if not await asyncio.to_thread(prom.query, signal):
                        empty.append(f"{rule.alert}: {signal}")
    assert not empty, "expressions with no data:\n" + "\n".join(empty)
    out_dir = Path(os.environ.get("TAILGUARD_OBSERVE_PNG", tmp_path / "png"))
    out_dir.mkdir(parents=True, exist_ok=True)
    for n, (row, panels) in enumerate(groupby(PANELS, key=lambda p: p.row)):
        path = out_dir / f"{n}-{row.lower().replace(' ', '-')}.png"
        draw_row(row, list(panels), series, started, path)
        assert path.stat().st_size > 10_000


def _docs_scrape_config() -> dict[str, Any]:
    """The scrape config docs/observability.md gives a Prometheus on another host."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    section = text[text.index("## Scraping `/metrics`"):]
    block = section[section.index("```yaml\n") + 8:section.index("```", section.index("```yaml\n") + 8)]
    [scrape] = yaml.safe_load(block)["scrape_configs"]
    return dict(scrape)


ADMIN = "prom-admin-0123456789"


@pytest.fixture(scope="module", autouse=True)
def docs_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, socket.socket]]:
    """A real Prometheus scraping with the docs' own block (its target a socket bound here, held
    for the gateway of the test below; its key file holding ADMIN), started with the module:
    Prometheus 2.42 scrapes a static target 5 s after it starts at the earliest (its discovery
    and scrape managers' fixed start-up throttle), so those 5 s pass while the test above runs."""
    tool("prometheus")
    folder = tmp_path_factory.mktemp("docs-prometheus")
    key_file = folder / "tailguard-admin-key"
    key_file.write_text(ADMIN + "\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # not listening yet: Prometheus's scrapes are refused until the gateway is
        host, port = sock.getsockname()
        scrape = _docs_scrape_config()
        scrape.update(scrape_interval="500ms", static_configs=[{"targets": [f"{host}:{port}"]}])
        scrape["authorization"]["credentials_file"] = str(key_file)
        with running_prometheus(folder, {}, scrapes=[scrape]) as prom:
            yield prom, sock


async def test_the_documented_scrape_config_sends_the_admin_key(
        docs_prometheus: tuple[Prometheus, socket.socket]) -> None:
    """A gateway whose /metrics needs an admin key from everyone (`open_metrics: keys`) is scraped
    by a real Prometheus with the docs' own block: `up` is 1 and tailguard's series are there."""
    prom, sock = docs_prometheus
    async with asyncio.timeout(60), gateway(auth={"api_keys": {"sk-app": {"name": "app"}}, "admin_keys": [ADMIN],
                                                  "open_metrics": "keys"}, sock=sock):
        while not await asyncio.to_thread(prom.query, 'up{job="tailguard"} == 1'):
            await asyncio.sleep(0.25)
        assert await asyncio.to_thread(prom.query, 'tailguard_queue_length{job="tailguard"}')
