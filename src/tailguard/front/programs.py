"""What the front remembers of each agent program: the service it has received (decayed over
time) and the backend its last call went to; bounded, pure, no I/O.

A program is a session's calls known as one (`front.identity` names it; `Arrive.program`). Its
attained service is the tokens its calls used (prompt and generated, told as each ends), halved
every `half_life_s` (llm-d's program-aware fairness keeps least attained service over tokens with
a 60 s half-life), so a program back after a long idle gap starts nearly afresh: what orders its
next call (`front.plas`). Its home is the backend that took its last call, trusted for
`affinity_ttl_s` after that call (vLLM's router keeps an agent's KV for a TTL between its tool
calls): the router sends its next call there while that backend is not loaded past the bound
prefix affinity uses (`front.router`), so the engine's prefix cache holds its context, and
sibling calls that arrive together (parallel tool calls, best-of-n) land together.

Nothing but ids, counters and instants is kept, for at most `max_programs` programs, the least
recently heard from dropped first, and none longer than `ttl_s` after it was last heard from.

    book = ProgramBook(ProgramParams())
    book.bound("p1", "b1", now=0.0)             # its call went to b1
    book.served("p1", tokens=3000, now=4.0)     # and used 3,000 tokens
    book.level("p1", now=5.0)                   # front.plas's level of what it has received
    book.home("p1", now=5.0)                    # "b1"
"""

from __future__ import annotations

import math
from collections import OrderedDict

from tailguard.front.params import ProgramParams
from tailguard.front.plas import level


class _Program:
    __slots__ = ("started_at", "service", "served_at", "home", "home_at", "heard_at")

    def __init__(self, now: float) -> None:
        self.started_at = now  # its first call's arrival (as far as this book remembers)
        self.service = 0.0  # tokens received, decayed to `served_at`
        self.served_at = now
        self.home: str | None = None  # the backend of its last call
        self.home_at = now
        self.heard_at = now  # the last event about it (what the TTL counts from)


class ProgramBook:
    """Per program: attained service and home backend, least recently heard from dropped first."""

    def __init__(self, params: ProgramParams) -> None:
        self.params = params
        self._programs: OrderedDict[str, _Program] = OrderedDict()

    def __len__(self) -> int:
        return len(self._programs)

    def reconfigure(self, params: ProgramParams) -> None:
        """New settings; what is remembered stays (within the new bounds, at the next change)."""
        self.params = params

    def service(self, program: str, now: float) -> float:
        """The tokens `program` has received, decayed to `now` (0 for one not known)."""
        p = self._programs.get(program)
        return 0.0 if p is None else self._decayed(p, now)

    def level(self, program: str | None, now: float) -> int:
        """Its calls' place in the order (`front.plas.level`): 0 with PLAS off or no program."""
        params = self.params
        if program is None or not params.plas:
            return 0
        return level(self.service(program, now), params.quantum_tokens, params.levels)

    def place(self, program: str | None, now: float) -> tuple[int, float]:
        """A call of `program` arrives: its level (`level`) and the instant its program started,
        what orders it among its rank's calls (`front.plas`); (0, now) for none."""
        if program is None:
            return 0, now
        p = self._touch(program, now)
        return self.level(program, now), p.started_at

    def home(self, program: str | None, now: float) -> str | None:
        """The backend that took `program`'s last call, while its KV is trusted to be there."""
        if program is None or not self.params.affinity:
            return None
        p = self._programs.get(program)
        if p is None or p.home is None or now - p.home_at > self.params.affinity_ttl_s:
            return None
        return p.home

    def bound(self, program: str, backend: str, now: float) -> None:
        """A call of `program` was sent to `backend`: its home from now."""
        p = self._touch(program, now)
        p.home, p.home_at = backend, now

    def served(self, program: str, tokens: int, now: float) -> None:
        """A call of `program` ended having used `tokens`: added to its service, and its KV stays
        in its backend's cache from now (the affinity's TTL counts from the call's end)."""
        p = self._touch(program, now)
        p.service = self._decayed(p, now) + max(0, tokens)
        p.served_at = now
        if p.home is not None:
            p.home_at = now

    def forget_backend(self, backend: str) -> None:
        """`backend` left the fleet: no program's calls are kept there."""
        for p in self._programs.values():
            if p.home == backend:
                p.home = None

    def _decayed(self, p: _Program, now: float) -> float:
        half_life = self.params.half_life_s
        if p.service == 0.0 or half_life <= 0 or now <= p.served_at:
            return p.service
        return p.service * math.exp2(-(now - p.served_at) / half_life)

    def _touch(self, program: str, now: float) -> _Program:
        """`program`'s record, made if new, as the most recently heard from; the records past the
        bounds (too many, or silent for `ttl_s`) are dropped, oldest first."""
        programs = self._programs
        p = programs.get(program)
        if p is None:
            p = programs[program] = _Program(now)
        else:
            programs.move_to_end(program)
        p.heard_at = now
        limit, stale_before = max(1, self.params.max_programs), now - self.params.ttl_s
        while len(programs) > limit or next(iter(programs.values())).heard_at < stale_before:
            programs.popitem(last=False)
        return p
