"""`diagnose`: every rule over one run, findings most severe first (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tailguard.bench.attribution import attribute_all
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import summarize
from tailguard.doctor.evidence import EngineEvidence, GatewayEvidence
from tailguard.doctor.facts import run_facts
from tailguard.doctor.finding import Finding, ordered
from tailguard.doctor.rules import RULES


def diagnose(records: Sequence[RequestRecord], meta: dict[str, Any], *, engine: EngineEvidence | None = None,
             gateway: GatewayEvidence | None = None, summary: dict[str, Any] | None = None,
             run_dir: str = ".") -> list[Finding]:
    """Findings for a run (saved in `run_dir`, which its commands name); an empty list when nothing
    is wrong. Records lacking an attribution get one."""
    if any(r.attribution is None for r in records):
        attribute_all(records)
    facts = run_facts(records, meta, summary if summary is not None else summarize(records, meta, n_boot=0), run_dir)
    found = [rule(facts, engine, gateway) for rule in RULES.values()]
    return ordered([x for x in found if x is not None])
