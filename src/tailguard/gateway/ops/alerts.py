"""Prometheus alert rules over the catalog's metrics; pure, no I/O.

Each rule is a signal, a comparison and a threshold, kept apart so a test can run the signal on a
real Prometheus (it must return data after a short load) while the rule as a whole stays quiet.
`deploy/generate.py` writes them to deploy/prometheus/alerts.yaml; `promtool check rules` and
`promtool test rules` (deploy/prometheus/alerts_test.yaml) check the file.

The TTFT objective is a multi-window burn rate (Google's SRE workbook, chapter 5): the share of
first tokens slower than the SLO, over a long and a short window together, against the error
budget of a P99 objective. The SLO must be one of the histogram's bucket bounds (`le`).

Only a class with a TTFT target is judged: one rule per class, on that class's series alone, so
a class that is held back on purpose (batch: its first tokens wait behind every chat) never
pages. The targets are a map of class to seconds (`DEFAULT_TTFT_TARGETS`: interactive, 1 s),
given to `deploy/generate.py --ttft-slo CLASS=SECONDS`. When classes carry SLOs of their own
(`classes[].slo.ttft_s`), the map is read from the config, `{c.name: c.slo.ttft_s for c in
cfg.classes if c.slo and c.slo.ttft_s}`, and nothing here changes.

Each rule's `runbook_url` is the section of the docs that says what to do, under a base URL that
is a setting (`--runbook-base`): where your team reads these docs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from tailguard.gateway.ops.catalog import BY_NAME

RUNBOOK_BASE = "https://github.com/tailguard/tailguard/blob/main/docs/"  # the docs folder; `--runbook-base`
RUNBOOK = "tuning.md"
DEFAULT_TTFT_TARGETS: Mapping[str, float] = {"interactive": 1.0}  # class -> TTFT SLO in seconds
_BUDGET = 0.01  # a P99 objective: 1% of first tokens may be slower than the SLO


@dataclass(frozen=True, slots=True)
class Rule:
    alert: str
    expr: str
    signals: tuple[str, ...]  # the expression's parts that return data whenever the gateway serves
    for_: str
    severity: str
    summary: str
    runbook: str  # the section of the docs that says what to do, relative to the docs folder


def _over(alert: str, signal: str, op: str, threshold: str, for_: str, severity: str, summary: str,
          runbook: str) -> Rule:
    """A rule that is one signal compared with a threshold."""
    return Rule(alert, f"{signal} {op} {threshold}", (signal,), for_, severity, summary, runbook)


def _slow_share(cls: str, slo_s: float, window: str) -> str:
    """The share of `cls`'s first tokens slower than `slo_s` over `window`."""
    return (f"(1 - sum by (class) (rate(tailguard_ttft_seconds_bucket{{class=\"{cls}\",le=\"{slo_s!r}\"}}[{window}]))"
            f" / sum by (class) (rate(tailguard_ttft_seconds_count{{class=\"{cls}\"}}[{window}])))")


def _burn(name: str, cls: str, slo_s: float, long: str, short: str, factor: float, severity: str) -> Rule:
    threshold = f"{factor * _BUDGET:g}"
    slow_long, slow_short = _slow_share(cls, slo_s, long), _slow_share(cls, slo_s, short)
    # Both windows: the long one says the budget really burns, the short one that it still does,
    # so the alert stops soon after a fix.
    return Rule(name, f"{slow_long} > {threshold} and {slow_short} > {threshold}", (slow_long, slow_short), "2m",
                severity, f"{cls}: first tokens slower than {slo_s:g} s burn the P99 budget "
                f"{factor:g}x too fast ({long} and {short})",
                f"{RUNBOOK}#3-choose-how-batch-work-yields-to-interactive-work")


def _burns(targets: Mapping[str, float]) -> tuple[Rule, ...]:
    """The fast (page) and slow (ticket) burn rules of each class with a TTFT target."""
    known = BY_NAME["tailguard_ttft_seconds"].buckets
    for cls, slo_s in targets.items():
        if slo_s not in known:
            raise ValueError(f"the TTFT SLO of {cls} ({slo_s:g} s) must be a bucket bound of tailguard_ttft_seconds: "
                             f"{', '.join(f'{b:g}' for b in known)}")
    return tuple(rule for cls, slo_s in sorted(targets.items()) for rule in (
        _burn("TailguardTTFTBudgetBurnFast", cls, slo_s, "1h", "5m", 14.4, "page"),
        _burn("TailguardTTFTBudgetBurnSlow", cls, slo_s, "6h", "30m", 6.0, "ticket")))


# The share of requests whose client left before the answer ended (0 while none has: the series
# appears with the first such request).
_GONE = ('(sum(rate(tailguard_requests_total{outcome="client_gone"}[10m])) or vector(0)) / '
         'sum(rate(tailguard_requests_total[10m]))')


def rules(ttft_targets: Mapping[str, float] = DEFAULT_TTFT_TARGETS) -> tuple[Rule, ...]:
    """Every rule; the TTFT burn rules for the classes in `ttft_targets` (class -> SLO seconds) only."""
    return (
        *_burns(ttft_targets),
        _over("TailguardQueueWaitNearBound",
             "histogram_quantile(0.99, sum by (class, le) (rate(tailguard_queue_wait_seconds_bucket[5m])))"
             " / on (class) max by (class) (tailguard_class_queue_bound_seconds)", ">", "0.8", "5m", "ticket",
             "{{ $labels.class }}: queue wait P99 is {{ $value | humanizePercentage }} of its bound; "
             "refusals (wait_bound) follow",
             f"{RUNBOOK}#overload-what-is-admitted-stays-within-its-bound"),
        _over("TailguardRejecting",
             "sum by (class, reason) (rate(tailguard_rejected_total[5m])) / on (class) group_left "
             "sum by (class) (rate(tailguard_requests_total[5m]))", ">", "0.05", "5m", "ticket",
             "{{ $labels.class }}: {{ $value | humanizePercentage }} of requests refused ({{ $labels.reason }})",
             f"{RUNBOOK}#overload-what-is-admitted-stays-within-its-bound"),
        _over("TailguardBackendDown", "max by (backend) (tailguard_backend_healthy)", "==", "0", "1m", "page",
             "backend {{ $labels.backend }} fails its health probes: it takes no requests",
             f"{RUNBOOK}#2-put-the-gateway-in-front-with-the-engines-own-limit"),
        _over("TailguardEngineQueueing",
             'max by (backend) (tailguard_backend_engine_requests{state="waiting"})', ">", "0", "5m", "ticket",
             "backend {{ $labels.backend }}: requests queue inside the engine; the gateway's max_concurrency is "
             "above the engine's slots",
             f"{RUNBOOK}#2-put-the-gateway-in-front-with-the-engines-own-limit"),
        Rule("TailguardClientsGiveUpWhileEnginesSucceed",
             f"{_GONE} > 0.02 unless on () sum(rate(tailguard_upstream_errors_total[10m])) > 0", (_GONE,), "10m",
             "ticket",
             "{{ $value | humanizePercentage }} of clients leave before their answer while the engines answer: "
             "a client's total timeout is shorter than a generation (use a first-token timeout and stream)",
             f"{RUNBOOK}#5-deadlines"),
        _over("TailguardNeedsCapacity", "max by (pool) (tailguard_capacity_needed) - max by (pool) (tailguard_capacity_ready)", ">", "0",
             "10m", "ticket",
             "pool {{ $labels.pool }}: the load needs {{ $value }} more backend(s) to keep every class inside its "
             "queue bound",
             f"{RUNBOOK}#overload-what-is-admitted-stays-within-its-bound"),
    )


def runbook_url(rule: Rule, base: str = RUNBOOK_BASE) -> str:
    """The rule's runbook as a link (Prometheus's and Alertmanager's `runbook_url` annotation)."""
    return base.rstrip("/") + "/" + rule.runbook


def document(ttft_targets: Mapping[str, float] = DEFAULT_TTFT_TARGETS,
             runbook_base: str = RUNBOOK_BASE) -> dict[str, object]:
    """The rule file as Prometheus reads it."""
    return {"groups": [{"name": "tailguard", "rules": [
        {"alert": r.alert, "expr": r.expr, "for": r.for_, "labels": {"severity": r.severity},
         "annotations": {"summary": r.summary, "runbook_url": runbook_url(r, runbook_base)}}
        for r in rules(ttft_targets)]}]}


def render(ttft_targets: Mapping[str, float] = DEFAULT_TTFT_TARGETS, runbook_base: str = RUNBOOK_BASE) -> str:
    """The file's text, as deploy/prometheus/alerts.yaml holds it."""
    header = "# Generated by deploy/generate.py from tailguard's metric catalog: do not edit by hand.\n"
    return header + yaml.safe_dump(document(ttft_targets, runbook_base), sort_keys=False, width=120)
