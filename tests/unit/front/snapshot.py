"""The whole state of a front as plain values, so a test can say "nothing changed" of it: every
attribute of every object it holds, followed down (slots too), bound methods and the tables of
them left out. Two snapshots are equal exactly when the front would decide the same from then on."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


def snapshot(obj: object) -> Any:
    return _plain(obj, set())


def _plain(v: Any, seen: set[int]) -> Any:
    if v is None or isinstance(v, (str, int, float, bool, enum.Enum)):
        return v
    if callable(v) and not isinstance(v, type) and not hasattr(v, "__dict__") and not hasattr(v, "__slots__"):
        return "<callable>"
    if id(v) in seen:
        return "<seen>"
    seen = seen | {id(v)}
    if isinstance(v, Mapping):
        return {repr(k): _plain(x, seen) for k, x in v.items() if not _method(x)}
    if isinstance(v, (list, tuple)):
        return [_plain(x, seen) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(repr(x) for x in v)
    fields: dict[str, Any] = {}
    for cls in type(v).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(v, name):
                fields[name] = getattr(v, name)
    fields.update(getattr(v, "__dict__", {}))
    return {type(v).__name__: {k: _plain(x, seen) for k, x in sorted(fields.items()) if not _method(x)}}


def _method(v: Any) -> bool:
    return callable(v) and hasattr(v, "__self__")
