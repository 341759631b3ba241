"""A run's tables at 80 columns: every figure shown whole (no ellipsis, no figure folded across
two lines), nothing wider than the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from tailguard.bench.stats import summarize
from tailguard.bench.table import fmt_s, summary_tables
from tests.unit.bench.test_report import fake_run


def rendered() -> tuple[dict[str, Any], str]:
    """A run's summary and its tables as an 80-column terminal shows them."""
    run = fake_run(0, slow_chat=True)
    summary = summarize(run.records, run.meta, n_boot=200)
    console = Console(width=80, record=True, color_system=None)
    console.print(summary_tables(summary))
    return summary, console.export_text()


def test_summary_tables_fit_80_columns_with_every_figure_whole() -> None:
    summary, text = rendered()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    words = set(text.split())
    for name, g in [*summary["classes"].items(), ("overall", summary["overall"])]:
        assert name in words
        for metric in ("e2e_s", "ttft_s"):
            for key in ("p50", "p99", "max", "mean"):
                assert fmt_s(g[metric][key]) in words, (name, metric, key)
        lo, hi = g["tail_ratio"]["e2e_s"]["ci95"]
        assert any(w.startswith(f"{lo:.2f}x-") or w.startswith(f"{lo:.1f}x-") for w in words)


def test_the_tables_name_each_metric_plainly_and_show_the_low_end_and_the_lengths() -> None:
    summary, text = rendered()
    words = text.split()
    assert "ITL/chunk" in words and "ITL" not in words  # ours is per chunk; theirs is per request (our TPOT)
    assert "AIPerf's inter-chunk latency, vllm bench's ITL)" in " ".join(words)
    assert "(AIPerf's and GuideLLM's ITL)." in " ".join(words)
    for header in ("min", "P1", "P5", "P10", "P25", "std", "input", "output"):
        assert header in words, header
    g = summary["overall"]
    assert fmt_s(g["ttft_s"]["p1"]) in words and fmt_s(g["e2e_s"]["std"]) in words
    assert max(len(line) for line in text.splitlines()) <= 80
