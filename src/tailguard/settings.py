"""A config as dotted settings, its digest, and what changed between two; pure, no I/O.

A leaf shared by the gateway (which hashes and stores what it applies), the `tailguard config`
verbs and bench's readers (`bench compare`, `doctor`), which see only what a run recorded. Names
are the YAML's own: `scheduler.aging_s`, and a list of named items is indexed by name, so a
setting keeps its name when the list is reordered: `classes[batch].max_tokens_cap`.

    changes = diff(flatten(old), flatten(new))
    print("\\n".join(str(c) for c in changes))   # classes[batch].max_tokens_cap: 4096 -> 2048
    print("\\n".join(described(flatten(old), flatten(new))))   # the same, a group added or removed whole in one line
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A setting absent on one side (a class added, an optional field left out).
UNSET = "(unset)"


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf setting of `data` by its dotted name."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        _put(out, f"{prefix}.{key}" if prefix else str(key), value)
    return out


def _put(out: dict[str, Any], name: str, value: Any) -> None:
    if isinstance(value, Mapping):
        if not value:
            out[name] = {}
        for key, v in value.items():
            _put(out, f"{name}.{key}", v)
    elif isinstance(value, list) and value and all(isinstance(v, Mapping) and "name" in v for v in value):
        for item in value:
            _put(out, f"{name}[{item['name']}]", {k: v for k, v in item.items() if k != "name"})
    else:
        out[name] = value


def digest(data: Mapping[str, Any]) -> str:
    """A short content hash of `data`: equal settings give equal digests, whatever the key order."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Change:
    """One setting that differs: `name: old -> new`."""

    name: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.name}: {_text(self.old)} -> {_text(self.new)}"


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The settings of two flattened configs that differ, in name order."""
    names = sorted(set(old) | set(new))
    return [Change(n, old.get(n, UNSET), new.get(n, UNSET)) for n in names if old.get(n, UNSET) != new.get(n, UNSET)]


def described(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`diff` as lines to read, with anything added or removed whole (a backend, a class, an API
    key, a section) as one line: `backends[b]: added (url http://127.0.0.1:8001, max_concurrency 4)`
    (its settings that are set), or `auth.api_keys.1f2e3d: removed`. What both sides hold shows
    setting by setting."""
    lines: list[str] = []
    done: set[str] = set()
    for c in diff(old, new):
        if (c.old, c.new) in (({}, UNSET), (UNSET, {})):
            continue  # an empty group that gained or lost its first items: those are the lines
        whole = _absent_prefix(c.name, new if c.new == UNSET else old)
        if whole is None:
            lines.append(str(c))
        elif whole not in done:
            done.add(whole)
            if c.old == UNSET:
                shown = [f"{n[len(whole):].lstrip('.')} {_text(v)}" for n, v in new.items() if _within(n, whole) and v is not None]
                lines.append(f"{whole}: added ({', '.join(shown)})" if shown else f"{whole}: added")
            else:
                lines.append(f"{whole}: removed")
    return lines


def _absent_prefix(name: str, side: Mapping[str, Any]) -> str | None:
    """The shortest group above the setting `name` (`auth`, `auth.api_keys`, `auth.api_keys.k`)
    of which `side` holds nothing; None when `side` holds some of each (only the leaf differs)."""
    for cut in _cuts(name):
        group = name[:cut]
        if not any(n == group or _within(n, group) for n in side):
            return group
    return None


def _cuts(name: str) -> list[int]:
    """Where `name` divides into groups: at each `.` and `[` outside an item's brackets, so a
    backend named for its address (`backends[127.0.0.1:8000]`, the quick form's) stays whole."""
    cuts, depth = [], 0
    for i, ch in enumerate(name):
        if ch in ".[" and depth == 0 and i > 0 and name[i - 1] != ".":
            cuts.append(i)
        depth += {"[": 1, "]": -1}.get(ch, 0)
    return cuts


def _within(name: str, group: str) -> bool:
    return name.startswith(group) and name[len(group):len(group) + 1] in (".", "[")


def item_of(name: str) -> str | None:
    """The named list item a setting belongs to, as `flatten` names it: `backends[b].url` ->
    `backends[b]`; None for a setting outside such a list."""
    item, sep, _ = name.partition("].")
    return item + "]" if sep else None


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
