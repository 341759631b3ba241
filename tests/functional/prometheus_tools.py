"""Debian's `prometheus` and `promtool` for the deploy tests: where they are, and a real Prometheus
server on loopback that the test starts and stops (`make prometheus` installs them)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib.parse
import urllib.request


def tool(name: str) -> str:
    """The binary's path; without it the test is skipped, except in CI where .ci/run installs it."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing: .ci/run installs it with `make prometheus`")
        pytest.skip(f"{name} is missing (make prometheus)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A running Prometheus's HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
            body = orjson.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` returns now (Prometheus refuses one that does not parse)."""
        data = self.get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step_s:g}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def scrapes(self, job: str) -> int:
        """Successful scrapes of `job` so far (its `up` series' samples that were 1)."""
        found = self.query(f'count_over_time(up{{job="{job}"}}[1h])')
        return int(float(found[0]["value"][1])) if found else 0


@contextmanager
def _serving(args: list[str], log_path: Path, ready_url: str) -> Iterator[None]:
    """A server process (`args`, stderr to `log_path`) until `ready_url` answers 200 (30 s at most);
    stopped (and waited for) on exit, whatever happened."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not _ready(ready_url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{Path(args[0]).name} did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextmanager
def running_prometheus(workdir: Path, targets: dict[str, str], rule_file: Path | None = None,
                       scrape_s: float = 0.5, scrapes: Sequence[dict[str, Any]] = ()) -> Iterator[Prometheus]:
    """Prometheus scraping each `job: host:port` every `scrape_s` (and by each of `scrapes`, scrape
    configs as written), evaluating `rule_file`; stopped (and waited for) on exit, whatever happened."""
    port = _free_port()
    config = {"global": {"scrape_interval": f"{int(scrape_s * 1000)}ms",
                         "evaluation_interval": f"{int(scrape_s * 1000)}ms"},
              "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                                 for job, target in targets.items()] + list(scrapes)}
    if rule_file is not None:
        config["rule_files"] = [str(rule_file)]
    (workdir / "prometheus.yml").write_bytes(orjson.dumps(config))  # JSON is YAML
    url = f"http://127.0.0.1:{port}"
    with _serving([tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                   f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                   "--log.level=warn"], workdir / "prometheus.log", f"{url}/-/ready"):
        yield Prometheus(url)


@contextmanager
def running_node_exporter(workdir: Path) -> Iterator[str]:
    """Debian's `prometheus-node-exporter` on loopback (this machine's real CPUs, memory and swap);
    its base URL. Stopped (and waited for) on exit."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with _serving([tool("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{port}", "--log.level=error",
                   "--no-collector.systemd"], workdir / "node-exporter.log", f"{url}/metrics"):
        yield url
