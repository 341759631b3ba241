"""What `tailguard doctor` says about a run: findings of documented kinds (pure, no I/O).

A finding carries the symptom with the run's own numbers, the likely cause, the evidence for and
against it, the one change to try next and the command that checks it (the article's method:
measure, locate, change one thing, measure again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# The documented kinds (docs/doctor.md), in the order findings of one severity are listed:
# what to fix first comes first: hardware that is held down or full, since every other number is
# measured on it; a generator-bound run's numbers are suspect, so it says so last only among equals
# (it is "high" and outranks every "medium").
KINDS: tuple[str, ...] = (
    "throttled", "compute_bound", "head_of_line", "overload", "starvation", "client_timeouts", "cap_above_engine",
    "hidden_queue", "kv_pressure", "queue_bound", "queueing", "prefill", "prefix_misses", "buffered_stream",
    "priority_cost", "generator_bound",
)
Severity = Literal["high", "medium", "low"]
SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low")


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: Severity
    symptom: str
    cause: str
    next_step: str
    check: str
    evidence_for: tuple[str, ...] = ()
    evidence_against: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}; known: {', '.join(KINDS)}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "symptom": self.symptom,
                "evidence": {"for": list(self.evidence_for), "against": list(self.evidence_against)},
                "cause": self.cause, "next_step": self.next_step, "check": self.check}


def ordered(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, in `KINDS` order."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), KINDS.index(f.kind)))
