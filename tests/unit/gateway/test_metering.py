"""Usage per caller, class and model in SQLite (`gateway.ops.metering`): rows by minute, what a
restart keeps, the time range and caller filters, rejections by reason, and the bound on metric
labels. A real SQLite file in a temporary directory; the wall clock is a plain number."""

from __future__ import annotations

import stat
from pathlib import Path

from tailguard.gateway.ops.metering import FILE_NAME, OTHER, CallerLabels, Meter
from tailguard.gateway.request import Request
from tailguard.types import Outcome


def ended(caller: str | None, cls: str = "interactive", *, prompt: int = 10, output: int = 5,
          outcome: Outcome = Outcome.SUCCESS, reason: str | None = None) -> Request:
    t = Request("r", arrived_at=100.0, cls=cls, caller=caller, model="m", prompt_tokens=prompt, output_tokens=output)
    t.upstream_headers_at, t.first_content_at, t.finished_at = 100.1, 100.25, 101.0
    t.outcome, t.reason = outcome, reason
    return t


async def test_usage_survives_a_restart_and_is_read_by_range_and_caller(tmp_path: Path) -> None:
    now = [1_000_020.0]
    meter = Meter(tmp_path / FILE_NAME, clock=lambda: now[0])
    meter.record(ended("team-a"))
    meter.record(ended("team-a", prompt=20, output=7))
    refused = ended("team-a", outcome=Outcome.REJECTED, reason="rate_limit_tokens", output=0)
    refused.upstream_headers_at = refused.first_content_at = None
    meter.record(refused)
    meter.record(ended("team-b", "batch"))
    await meter.flush()
    now[0] += 3600  # an hour later
    meter.record(ended("team-a"))
    await meter.close()  # what is pending is written as it stops
    assert stat.S_IMODE((tmp_path / FILE_NAME).stat().st_mode) == 0o600

    again = Meter(tmp_path / FILE_NAME, clock=lambda: now[0])
    [a], scope = await again.usage(None, 1_000_020.0 + 60, "team-a")  # the first minute only
    assert scope == "replica"  # no state.url: its own file
    assert (a["class"], a["model"], a["requests"], a["prompt_tokens"], a["output_tokens"]) == ("interactive", "m", 3, 30, 12)
    assert a["outcomes"] == {"success": 2, "rejected": 1} and a["rejections"] == {"rate_limit_tokens": 1}
    assert a["mean_e2e_s"] == 1.0 and a["mean_ttft_s"] == 0.25
    rows, _ = await again.usage(None, None, None)
    assert [(r["caller"], r["class"], r["requests"]) for r in rows] == [("team-a", "interactive", 4),
                                                                      ("team-b", "batch", 1)]
    assert await again.usage(now[0] + 60, None, None) == ([], "replica")
    await again.close()


def test_metric_labels_are_bounded() -> None:
    labels = CallerLabels(max_callers=2)
    assert [labels(c) for c in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]
