"""The optional C extension, selected once at import: `speedups` is `tailguard._speedups`, or None
where it was not built (no compiler at install) or `TAILGUARD_NO_EXTENSIONS` is set to anything but
"" or "0" (aiohttp's `AIOHTTP_NO_EXTENSIONS`), or built from another version of `_speedups.c`
(`ABI`), and the pure-Python twins run instead.

What it holds is the relay's per-chunk hot loop (`_speedups.c`): the content test
(`wire.chunks.has_content`) and one call per relayed chunk (`StreamRelay`'s step). Each is the
exact twin of Python code kept beside it, and `tests/unit/gateway/test_speedups.py` runs both on the same
streams; the C one is there because a chunk's Python (a call, an attribute, an argument at a time)
was most of what the gateway spent per chunk (docs/tuning.md, section 6)."""

from __future__ import annotations

import os
import warnings
from types import ModuleType

# What this code expects of `_speedups.c` (the attributes its step reads, the calls it makes), as
# the file's SPEEDUPS_ABI says: raised in both with every change, so an extension built from
# another version of the file (an editable install updated without a rebuild) is never used.
ABI = 1


def _load() -> ModuleType | None:
    if os.environ.get("TAILGUARD_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        from tailguard import _speedups
    except ImportError:
        return None
    return matching(_speedups)


def matching(module: ModuleType) -> ModuleType | None:
    """`module` if it was built from this version of `_speedups.c`; else None, with a warning:
    its step would read attributes this code no longer has, and fail every stream."""
    built = getattr(module, "ABI", None)
    if built == ABI:
        return module
    warnings.warn(f"tailguard._speedups was built from another version of _speedups.c (ABI {built}, this code "
                  f"needs {ABI}): the relay runs its Python code instead; rebuild it with `make` or "
                  f"`pip install -e .`", RuntimeWarning, stacklevel=2)
    return None


speedups = _load()
