"""One request of a trace as every format's reader gives it, and the trace it belongs to; pure.

A trace carries arrival instants and sizes, not text: `at` (seconds since the trace's first
request), the prompt's and the answer's token counts, and where the format says so the prompt's
512-token blocks (Mooncake's `hash_ids`), a session, the class a gateway gave it. `fields` keeps
the line's own columns, for the rule file that maps them to a class (`trace/rules.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

Scalar = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class TraceRequest:
    at: float
    input_tokens: int
    output_tokens: int
    line: int  # where it is in its file (1-based), for messages
    hash_ids: tuple[int, ...] = ()
    session: str | None = None
    cls: str | None = None  # the class it had where it was recorded (tailguard's own formats)
    class_header: str | None = None  # the class a gateway gave it: sent again as X-Tailguard-Class
    endpoint: str | None = None  # chat or completions, where the record says which
    fields: Mapping[str, Scalar] = field(default_factory=dict)

    def value(self, name: str) -> Scalar:
        """A field for a rule: the line's own column, or one of the sizes and the session by the
        names every format shares (`input_tokens`, `output_tokens`, `session`, `class`)."""
        if name in self.fields:
            return self.fields[name]
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens, "session": self.session,
                "class": self.cls}.get(name)


SHARED_FIELDS = ("input_tokens", "output_tokens", "session", "class")


@dataclass(frozen=True, slots=True)
class Trace:
    """A whole trace in arrival order (`at` from 0), its format, the size of its prefix blocks
    in tokens (0: it says nothing of shared prefixes), and what the reader had to change or skip."""

    path: str
    format: str
    requests: list[TraceRequest]
    block_tokens: int = 0
    notes: tuple[str, ...] = ()

    @property
    def span_s(self) -> float:
        return self.requests[-1].at - self.requests[0].at if self.requests else 0.0

    def field_names(self) -> set[str]:
        names = set(SHARED_FIELDS)
        for r in self.requests[:1000]:
            names.update(r.fields)
        return names


def rebased(requests: list[TraceRequest]) -> list[TraceRequest]:
    """`requests` sorted by arrival (stably: equal instants keep the file's order), their instants
    counted from the first one's."""
    ordered = sorted(requests, key=lambda r: r.at)
    if not ordered:
        return ordered
    t0 = ordered[0].at
    return [replace(r, at=r.at - t0) for r in ordered]
