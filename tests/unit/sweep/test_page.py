"""The sweep's figures: no label prints over another, whether values measured the same (a cap
that never binds) or the knee is the recommended value."""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation

from tailguard.sweep.page import knee_figure, pareto_figure


def point(value: int, tokens_per_s: float, ttft_s: float) -> dict[str, Any]:
    return {"value": value, "runs": 1, "throughput_tokens_per_s": tokens_per_s, "meets_slo": True,
            "p99": {"chat": {"e2e_s": {"mean": 2 * ttft_s}, "ttft_s": {"mean": ttft_s}}}}


# 8, 16 and 32 are at or above the 8 clients sent: they measured the same
RES = {"setting": "max_concurrency", "slo": [{"cls": "chat", "metric": "ttft_s", "bound_s": 0.5}],
       "points": [point(2, 318, 0.42), point(4, 505, 0.22), point(8, 907, 0.03), point(16, 907, 0.03),
                  point(32, 907, 0.03)], "knee": 8, "recommended": 8}


def labels(fig: Figure) -> list[tuple[str, Any]]:
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return [(a.get_text(), a.get_window_extent(renderer)) for ax in fig.axes for a in ax.texts
            if isinstance(a, Annotation)]


def assert_apart(found: list[tuple[str, Any]]) -> None:
    for i, (text, box) in enumerate(found):
        for other, box2 in found[i + 1:]:
            assert not box.overlaps(box2), (text, other)


def test_the_pareto_labels_do_not_overlap() -> None:
    found = labels(pareto_figure(RES))
    assert sorted(t for t, _ in found) == ["2", "4", "8 (knee, recommended), 16, 32"]
    assert_apart(found)


def test_the_knee_and_recommended_labels_do_not_overlap() -> None:
    found = labels(knee_figure(RES))
    assert [t for t, _ in found] == ["knee and recommended"]
    found = labels(knee_figure({**RES, "recommended": 4}))
    assert sorted(t for t, _ in found) == ["knee", "recommended"]
    assert_apart(found)
