"""The output folder: summary.json shape, a self-contained report.html, re-rendering from
requests.jsonl, and compare.html; built from records, no sockets."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import orjson
import pytest
from rich.console import Console

from tailguard.bench.load import RunResult
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.report import compare_dirs, rerender, write_outputs
from tailguard.bench.workload import load_workload


class Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def assert_self_contained(html: str) -> Collector:
    p = Collector()
    p.feed(html)
    p.close()
    for tag, attrs in p.tags:
        for name in ("src", "href", "srcset", "action", "data"):
            v = attrs.get(name)
            assert v is None or not re.match(r"\s*(https?:)?//", v), f"<{tag} {name}={v}> fetches from the network"
        if tag in ("script", "link", "iframe"):
            raise AssertionError(f"<{tag}> in a self-contained report")
    assert "@import" not in html and not re.search(r"url\(\s*['\"]?(https?:)?//", html)
    imgs = [a["src"] for t, a in p.tags if t == "img"]
    assert imgs and all(s is not None and s.startswith("data:image/png;base64,") for s in imgs)
    return p


def fake_run(seed: int, slow_chat: bool) -> RunResult:
    w, _ = load_workload("seed-mixed")
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(300):
        cls = "summary" if i % 25 == 0 else "chat"
        due = i * 0.1
        n = 2048 if cls == "summary" else 32
        ttft = float(rng.uniform(0.02, 0.05)) + (float(rng.uniform(5, 15)) if slow_chat and i % 9 == 0 else 0.0)
        itl = 0.008
        r = RequestRecord(index=i, cls=cls, warmup=i < 10, scheduled_at=due, sent_at=due + 0.0003, status=200,
                          ok=True, prompt_tokens=100, max_tokens=n, queue_ms=None)
        r.first_token_at = due + ttft
        r.chunk_at = [due + ttft + k * itl for k in range(n)]
        r.ended_at = r.chunk_at[-1] + 0.001
        r.usage_output_tokens = n
        r.finish_tokens()
        recs.append(r)
    if slow_chat:
        recs.append(RequestRecord(index=300, cls="chat", warmup=False, scheduled_at=31.0, sent_at=31.0,
                                  ended_at=91.0, error_kind="timeout", timeout_phase="first_token"))
    meta = {"seed": seed, "url": "http://127.0.0.1:1", "model": "m", "mode": "closed", "concurrency": 16,
            "max_dispatch_lag_s": 0.005, "workload": w.model_dump(mode="json"), "slo": w.slos(),
            "loop_lag_s": {"p50": 0.0001, "p99": 0.0008, "max": 0.002, "samples": 100}, "started_at": "now"}
    return RunResult(recs, meta)


def test_outputs_written_parsable_and_rerenderable(tmp_path: Path) -> None:
    out = tmp_path / "before"
    console = Console(record=True, width=160)
    summary = write_outputs(fake_run(0, slow_chat=True), out, console=console)
    assert {p.name for p in out.iterdir()} == {"summary.json", "requests.jsonl", "run.json", "report.html"}
    on_disk = orjson.loads((out / "summary.json").read_bytes())
    assert on_disk == summary
    assert list(on_disk["classes"]) == ["chat", "summary"]
    assert on_disk["overall"]["count"] == 291 and on_disk["overall"]["timeouts"] == 1
    assert on_disk["validity"]["valid"] is True
    assert len((out / "requests.jsonl").read_text().splitlines()) == 301
    page = assert_self_contained((out / "report.html").read_text())
    text = " ".join(page.text)
    for word in ("chat", "summary", "overall", "P99", "VALID run", "TTFT", "ITL", "timeouts", "slowest 1%"):
        assert word in text
    assert len([t for t, _ in page.tags if t == "img"]) == 6  # with the tail-attribution bars
    assert all(set(orjson.loads(line)["attribution"]) >= {"prefill_s", "stall_s"}
               for line in (out / "requests.jsonl").read_text().splitlines())
    shown = console.export_text()
    assert "chat" in shown and "E2E" in shown and "VALID run" in shown
    (out / "summary.json").unlink()
    (out / "report.html").unlink()
    assert rerender(out) == summary
    assert (out / "report.html").is_file()


def test_invalid_run_banner(tmp_path: Path) -> None:
    run = fake_run(1, slow_chat=False)
    for r in run.records[50:80]:
        r.sent_at = r.scheduled_at + 0.2
    summary = write_outputs(run, tmp_path / "late")
    assert summary["validity"]["valid"] is False
    html = (tmp_path / "late" / "report.html").read_text()
    assert "INVALID run" in html and "30 of 290 requests were sent late" in html and "What to do" in html


def test_compare_dirs_writes_table_and_page(tmp_path: Path) -> None:
    # compare reads the folders' records, not their pages (the test above checks a page)
    write_outputs(fake_run(0, slow_chat=True), tmp_path / "before", html=False)
    write_outputs(fake_run(1, slow_chat=False), tmp_path / "after", html=False)
    console = Console(record=True, width=160)
    cmp = compare_dirs(tmp_path / "before", tmp_path / "after", tmp_path / "cmp", console=console)
    assert {p.name for p in (tmp_path / "cmp").iterdir()} == {"compare.json", "compare.html"}
    assert orjson.loads((tmp_path / "cmp" / "compare.json").read_bytes()) == cmp
    v = cmp["classes"]["chat"]["verdict"]
    assert v == {"metric": "e2e_s", "p99_fell": True, "p99_fell_significantly": True, "gap_narrowed": True,
                 "timeout_rate_fell": True}
    assert cmp["before"]["label"] == "before" and cmp["after"]["label"] == "after"
    page = assert_self_contained((tmp_path / "cmp" / "compare.html").read_text())
    assert "fell" in " ".join(page.text)
    assert "Verdict" in console.export_text()


def test_missing_folder_is_a_config_error(tmp_path: Path) -> None:
    from tailguard.errors import ConfigError

    with pytest.raises(ConfigError, match="requests.jsonl is missing"):
        rerender(tmp_path)
