"""`diagnose`: every rule over one run, findings most severe first (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tailguard.bench.attribution import attribute_all
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stats import summarize
from tailguard.doctor.facts import RunFacts, run_facts
from tailguard.doctor.finding import Finding, ordered
from tailguard.doctor.hardware_rules import HARDWARE_RULES
from tailguard.doctor.pages import Evidence
from tailguard.doctor.priority import priority_cost
from tailguard.doctor.rules import RULES

Run = tuple[Sequence[RequestRecord], dict[str, Any]]  # a run's records and its run.json


def facts_of(records: Sequence[RequestRecord], meta: dict[str, Any], summary: dict[str, Any] | None = None,
             run_dir: str = ".") -> RunFacts:
    """A run's facts; records lacking an attribution get one."""
    if any(r.attribution is None for r in records):
        attribute_all(records)
    return run_facts(records, meta, summary if summary is not None else summarize(records, meta, n_boot=0), run_dir)


def diagnose(records: Sequence[RequestRecord], meta: dict[str, Any], *, evidence: Evidence = Evidence(),
             against: Run | None = None, summary: dict[str, Any] | None = None, run_dir: str = ".") -> list[Finding]:
    """Findings for a run (saved in `run_dir`, which its commands name); an empty list when nothing
    is wrong. The run's own rules first, then those that read the hardware with what they found,
    then, given an earlier run (`against`), what the change between them cost."""
    facts = facts_of(records, meta, summary, run_dir)
    found = [x for rule in RULES.values() if (x := rule(facts, evidence.engine, evidence.gateway)) is not None]
    found += [x for rule in HARDWARE_RULES.values() if (x := rule(facts, evidence, found)) is not None]
    if against is not None and (cost := priority_cost(facts, facts_of(*against))) is not None:
        found.append(cost)
    return ordered(found)
