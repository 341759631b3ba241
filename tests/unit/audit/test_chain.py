"""The hash chain finds an entry edited, removed or reordered, and a column that lies."""

from __future__ import annotations

import dataclasses

from tailguard.audit.chain import GENESIS, Entry, canonical, entry, link, verify


def chain(n: int, name: str = "gw:8080") -> list[Entry]:
    out: list[Entry] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        e = entry(name, seq, prev, {"kind": "request", "caller": "team-a" if seq % 2 else None,
                                    "at_unix": 1700000000.0 + seq, "status": 200, "request_id": f"r{seq}"})
        out.append(e)
        prev = e.hash
    return out


def test_an_intact_chain_passes_and_names_its_head() -> None:
    entries = chain(5)
    problems, head = verify("gw:8080", entries)
    assert problems == []
    assert (head.seq, head.hash, head.entries) == (5, entries[-1].hash, 5)
    assert str(head) == f"gw:8080:5:{entries[-1].hash}"


def test_an_edited_entry_is_named() -> None:
    entries = chain(5)
    doc = entries[2].fields()
    doc["status"] = 500
    entries[2] = dataclasses.replace(entries[2], doc=canonical(doc))
    problems, _ = verify("gw:8080", entries)
    assert [(p.seq, p.what) for p in problems] == [(3, "its hash does not match its content (edited)")]


def test_an_edited_entry_with_its_hash_recomputed_breaks_the_next_link() -> None:
    entries = chain(5)
    doc = entries[2].fields()
    doc["caller"] = "someone-else"
    body = canonical(doc)
    entries[2] = dataclasses.replace(entries[2], doc=body, caller="someone-else",
                                     hash=link("gw:8080", 3, entries[2].prev, body))
    problems, _ = verify("gw:8080", entries)
    assert [p.seq for p in problems] == [4]
    assert "does not follow entry 3" in str(problems[0])


def test_a_removed_entry_is_named() -> None:
    entries = chain(5)
    del entries[1]
    problems, _ = verify("gw:8080", entries)
    assert [str(p) for p in problems] == ["chain gw:8080 entry 3: follows entry 1: entries 2..2 are missing"]


def test_a_removed_entry_renumbered_is_named() -> None:
    """Whoever removes entry 2 and numbers the rest down still cannot make them follow."""
    entries = chain(5)
    del entries[1]
    entries = [dataclasses.replace(e, seq=i + 1) for i, e in enumerate(entries)]
    problems, _ = verify("gw:8080", entries)
    assert problems[0].seq == 2 and "does not follow entry 1" in problems[0].what


def test_reordered_entries_are_named() -> None:
    entries = chain(5)
    a, b = entries[1], entries[2]
    entries[1], entries[2] = dataclasses.replace(b, seq=2), dataclasses.replace(a, seq=3)
    problems, _ = verify("gw:8080", entries)
    assert {p.seq for p in problems} == {2, 3, 4}


def test_a_column_that_disagrees_with_its_document() -> None:
    entries = chain(3)
    entries[1] = dataclasses.replace(entries[1], caller="not-them")
    problems, _ = verify("gw:8080", entries)
    assert [(p.seq, p.what) for p in problems] == [(2, "its columns (at, kind, caller) disagree with its document")]


def test_an_entry_of_another_chain_is_not_this_ones() -> None:
    other = chain(3, name="gw:8081")
    problems, _ = verify("gw:8080", other)
    assert {p.seq for p in problems} == {1, 2, 3}


def test_checked_from_an_anchor_after_retention() -> None:
    entries = chain(6)
    kept = entries[3:]
    assert verify("gw:8080", kept, anchor=(3, entries[2].hash))[0] == []
    assert [p.seq for p in verify("gw:8080", kept)[0]] == [4]
    assert [p.seq for p in verify("gw:8080", kept, anchor=(3, entries[1].hash))[0]] == [4]
