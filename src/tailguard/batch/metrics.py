"""The batch runner's Prometheus collector: lines of the active batches by state, batches by
status (both as of the runner's last poll of the journal), line attempts sent and tokens used
by this process's lines, and an ETA at this process's pace. Registered on the gateway's own registry, read when /metrics is scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tailguard.batch.records import ACTIVE, DONE, FAILED, FINAL, QUEUED, RUNNING
from tailguard.batch.runner import Runner


class BatchCollector(Collector):
    def __init__(self, runner: Runner) -> None:
        self._runner = runner

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        r = self._runner
        lines = GaugeMetricFamily("tailguard_batch_lines", "Lines of the active batches by state (queued, running, "
                                  "done, failed), as of the runner's last look at the journal.", labels=["state"])
        for state in (QUEUED, RUNNING, DONE, FAILED):
            lines.add_metric([state], r.lines_by_state.get(state, 0))
        yield lines
        batches = GaugeMetricFamily("tailguard_batches", "Batches by status.", labels=["status"])
        for status in (*ACTIVE, *FINAL):
            batches.add_metric([status], r.batches_by_status.get(status, 0))
        yield batches
        yield CounterMetricFamily("tailguard_batch_line_attempts", "Line attempts this gateway sent into its front.",
                                  value=r.sent)
        tokens = CounterMetricFamily("tailguard_batch_tokens", "Tokens used by the batch lines this gateway ran.",
                                     labels=["kind"])
        for kind, n in r.tokens.items():
            tokens.add_metric([kind], n)
        yield tokens
        eta = r.eta_s()
        if eta is not None:
            yield GaugeMetricFamily("tailguard_batch_eta_seconds", "Seconds until the open lines of the active batches "
                                    "are done at this gateway's pace over its last 60 polls.", value=eta)
