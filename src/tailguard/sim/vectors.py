"""The simulator's embeddings: a deterministic unit vector per input, drawn from the input's
hash, so the same text always gets the same vector and different texts differ; pure, no I/O."""

from __future__ import annotations

import hashlib
import math

DIMENSIONS = 32


def vector(item: str | list[int], dimensions: int = DIMENSIONS) -> list[float]:
    """A unit vector of `dimensions` floats for a text or a list of token ids."""
    key = item.encode() if isinstance(item, str) else ",".join(map(str, item)).encode()
    raw = hashlib.shake_256(key).digest(2 * dimensions)
    v = [int.from_bytes(raw[2 * i:2 * i + 2], "little") / 32768.0 - 1.0 for i in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]
