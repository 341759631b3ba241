"""The comparison as printed: throughput rows, a verdict per class, an overall verdict on a mixed
workload that only speaks of what adds up across classes, and nothing cut at 80 columns."""

from __future__ import annotations

import re

from rich.console import Console

from tailguard.bench.compare import compare
from tailguard.bench.compare_table import compare_tables
from tests.unit.bench.test_compare import META, steady


def shown(cmp: dict, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(compare_tables(cmp))
    return console.export_text()


def test_mixed_comparison_prints_throughput_and_per_class_verdicts_whole_at_80_columns() -> None:
    before = steady(100, 1.0, 32) + steady(10, 10.0, 2048, "summary", start=1000)
    after = steady(120, 0.8, 32) + steady(10, 10.0, 2048, "summary", start=1000)
    text = shown(compare(before, META, after, META, n_boot=200), 80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "Throughput, after / before" in text and "requests/s" in text and "output tok/s" in text
    assert "chat: P99" in text and "summary: P99" in text
    overall = " ".join(text[text.index("overall: "):].split())
    assert overall.startswith("overall: requests/s") and "no latency verdict" in overall
    assert not re.search(r"P99 [0-9]", overall)  # no pooled percentile is judged


def test_the_demo_ends_with_the_readmes_headline_table() -> None:
    from tailguard.cli.demo import headline

    before = steady(100, 1.0, 32) + steady(10, 10.0, 2048, "summary", start=1000)
    after = steady(100, 1.0, 32) + steady(10, 10.0, 2048, "summary", start=1000)
    console = Console(width=80, record=True, color_system=None)
    console.print(headline(compare(before, META, after, META, n_boot=100), 16))
    text = console.export_text()
    assert "chat TTFT" in text and "summary" in text and "…" not in text
    rows = [line for line in text.splitlines() if line.split()[:1] in (["before"], ["after"])]
    assert len(rows) == 2 and "1.00s" in rows[0] and "(100%)" in text
