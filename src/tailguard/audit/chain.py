"""The audit trail's hash chain: how an entry is linked to the one before it, and how a chain is
checked; pure, no I/O.

Each entry's hash covers its chain's name, its number, the hash before it and its document
(canonical JSON: sorted keys, no spaces), so an entry edited, removed, moved to another place or
to another chain breaks the chain where it was:

    hash(n) = sha256("<chain>\\n<n>\\n<hash(n-1)>\\n" + doc(n))        hash(0) = GENESIS

`verify` reads a chain in order and names every entry where it breaks. What it cannot see alone
is the chain's end cut off (the last entries removed, with nothing after them to break): the
gateway logs each chain's head (`audit_head`: number and hash) every hour and at shutdown, and
`tailguard audit verify --head CHAIN:N:HASH` checks that a head seen then is still there.
Retention deletes a chain's oldest entries and keeps the last one it deleted as the chain's
anchor, from which the rest is checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

GENESIS = "0" * 64


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored entry. `at`, `kind` and `caller` repeat the document's own fields as columns,
    for queries; `verify` checks that they agree with it."""

    chain: str
    seq: int
    at: float
    kind: str
    caller: str | None
    doc: bytes
    prev: str
    hash: str

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = orjson.loads(self.doc)
        return out


def canonical(doc: Mapping[str, Any]) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def link(chain: str, seq: int, prev: str, doc: bytes) -> str:
    return hashlib.sha256(f"{chain}\n{seq}\n{prev}\n".encode() + doc).hexdigest()


def entry(chain: str, seq: int, prev: str, doc: Mapping[str, Any]) -> Entry:
    """The entry that follows `prev` as number `seq` of `chain`."""
    body = canonical(doc)
    return Entry(chain, seq, float(doc["at_unix"]), str(doc["kind"]), doc.get("caller"), body, prev,
                 link(chain, seq, prev, body))


@dataclass(frozen=True, slots=True)
class Problem:
    chain: str
    seq: int
    what: str

    def __str__(self) -> str:
        return f"chain {self.chain} entry {self.seq}: {self.what}"


@dataclass(frozen=True, slots=True)
class Head:
    """Where a chain stands: its last entry's number and hash, and how many entries were read."""

    chain: str
    seq: int
    hash: str
    entries: int

    def __str__(self) -> str:
        return f"{self.chain}:{self.seq}:{self.hash}"


def verify(chain: str, entries: Iterable[Entry], anchor: tuple[int, str] | None = None) -> tuple[list[Problem], Head]:
    """Check one chain's entries, read in order of their numbers, from its start (or from its
    `anchor`: the number and hash of the last entry retention deleted). Every break is named:
    an entry whose hash is not its content's (edited), one that does not follow the entry before
    it (one removed, or the order changed), one whose columns disagree with its document."""
    problems: list[Problem] = []
    seq, prev = anchor if anchor is not None else (0, GENESIS)
    n = 0
    for e in entries:
        n += 1
        if e.seq != seq + 1:
            problems.append(Problem(chain, e.seq, f"follows entry {seq}: entries {seq + 1}..{e.seq - 1} are missing"
                                    if e.seq > seq + 1 else f"is out of order (after entry {seq})"))
        elif e.prev != prev:
            problems.append(Problem(chain, e.seq, f"does not follow entry {seq} (its link is not that entry's hash: "
                                    "an entry was removed, reordered or rewritten)"))
        if link(e.chain, e.seq, e.prev, e.doc) != e.hash or e.chain != chain:
            problems.append(Problem(chain, e.seq, "its hash does not match its content (edited)"))
        else:
            try:
                fields = e.fields()
            except orjson.JSONDecodeError:
                fields = {}
            if (fields.get("at_unix"), fields.get("kind"), fields.get("caller")) != (e.at, e.kind, e.caller):
                problems.append(Problem(chain, e.seq, "its columns (at, kind, caller) disagree with its document"))
        seq, prev = e.seq, e.hash
    return problems, Head(chain, seq, prev, n)
