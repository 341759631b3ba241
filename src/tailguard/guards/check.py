"""What a guard runs on some texts and what it finds: the `Check` interface (the guard owns it),
and the built-in one, patterns found by a `Finder`.

A built-in check of a text up to `INLINE_CHARS` long runs at once on the event loop (tens of
microseconds for a chat prompt); a longer one on a worker thread, so a 4 MiB prompt never holds
the loop, and its guard's `timeout_s` bounds the wait as it bounds a moderation service's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tailguard.guards.patterns import Finder, Span

INLINE_CHARS = 64 * 1024
# What a check came to (the metrics' `verdict` label): it passed, its guard's action, or it failed.
PASS, BLOCK, REDACT, FLAG, ERROR_OPEN, ERROR_CLOSED = "pass", "block", "redact", "flag", "error_open", "error_closed"


@dataclass(frozen=True, slots=True)
class Finding:
    """What a check found in its texts: whether they are flagged, under which categories, and
    (a pattern check) the spans in each text, in the order of the texts."""

    flagged: bool
    categories: tuple[str, ...] = ()
    spans: tuple[tuple[Span, ...], ...] = ()


CLEAN = Finding(False)


class Check(Protocol):
    """One guard's check. `step_chars`: on a stream, how many new characters between two checks
    (1: every chunk)."""

    @property
    def step_chars(self) -> int: ...

    def inline(self, texts: Sequence[str]) -> Finding | None:
        """The finding at once, when it is cheap enough to get on the loop; else None, and
        `run` is awaited."""
        ...

    async def run(self, texts: Sequence[str]) -> Finding: ...


class PatternCheck:
    """Personal data or an operator's deny patterns (`guards.patterns`)."""

    step_chars = 1

    def __init__(self, finder: Finder) -> None:
        self.finder = finder

    def scan(self, texts: Sequence[str]) -> Finding:
        spans = tuple(tuple(self.finder.find(t)) for t in texts)
        kinds = sorted({s.kind for found in spans for s in found})
        return Finding(bool(kinds), tuple(kinds), spans) if kinds else CLEAN

    def inline(self, texts: Sequence[str]) -> Finding | None:
        return self.scan(texts) if sum(map(len, texts)) <= INLINE_CHARS else None

    async def run(self, texts: Sequence[str]) -> Finding:
        return await asyncio.to_thread(self.scan, texts)
