"""The optional C extension, selected once at import: `speedups` is `tailguard._speedups`, or None
where it was not built (no compiler at install) or `TAILGUARD_NO_EXTENSIONS` is set to anything but
"" or "0" (aiohttp's `AIOHTTP_NO_EXTENSIONS`), and the pure-Python twins run instead.

What it holds is the relay's per-chunk hot loop (`_speedups.c`): the content test
(`wire.chunks.has_content`) and one call per relayed chunk (`StreamRelay`'s step). Each is the
exact twin of Python code kept beside it, and `tests/unit/gateway/test_speedups.py` runs both on the same
streams; the C one is there because a chunk's Python (a call, an attribute, an argument at a time)
was most of what the gateway spent per chunk (docs/tuning.md, section 6)."""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("TAILGUARD_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        from tailguard import _speedups
    except ImportError:
        return None
    return _speedups


speedups = _load()
