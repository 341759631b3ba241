"""Which backend last served each prompt prefix: a bounded index; pure, no I/O.

A prompt is known to the front as a chain of block hashes (`Arrive.prefix`): hash i stands for
the whole prompt up to the end of block i, so two prompts share their first k blocks exactly when
their first k hashes are equal (vLLM keys its prefix cache the same way, by chained block hashes).
An engine's prefix cache only helps when the same instance sees a prefix again, so the router
asks which backend served the longest known part of this prompt, and tells the index where each
request went.

The index remembers at most `max_blocks` hashes, dropping the least recently used first: an
engine's cache is bounded too, and a prefix nobody has sent for a long time is likely gone from
it. (SGLang's model gateway keeps an approximate radix tree per worker for the same purpose;
chained hashes give the same longest-match answer with one dict.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """hash -> backend, least recently used dropped first.

        index = PrefixIndex(1 << 16)
        index.served(prompt_blocks, "b1")
        index.longest(other_blocks)   # ("b1", 12): b1 served its first 12 blocks
    """

    __slots__ = ("_max", "_where")

    def __init__(self, max_blocks: int) -> None:
        self._max = max(1, max_blocks)
        self._where: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def longest(self, blocks: Sequence[int]) -> tuple[str | None, int]:
        """The backend that served the longest leading run of `blocks`, and that run's length in
        blocks ((None, 0) when none is known). A chained hash stands for its whole prefix, so the
        deepest known block decides; blocks are walked from the start until one is unknown."""
        where = self._where
        found: str | None = None
        n = 0
        for h in blocks:
            b = where.get(h)
            if b is None:
                break
            found, n = b, n + 1
        return found, n

    def hits(self, blocks: Sequence[int]) -> dict[str, int]:
        """For each backend that served some leading run of `blocks`, that run's length in
        blocks: how much of the prompt its prefix cache is expected to hold. A block's hash names
        the last backend sent it, and a chained hash stands for its whole prefix, so a backend
        holds the run up to the deepest block it is named for."""
        where = self._where
        out: dict[str, int] = {}
        for i, h in enumerate(blocks):
            b = where.get(h)
            if b is None:
                break
            out[b] = i + 1
        return out

    def served(self, blocks: Sequence[int], backend: str) -> None:
        """`backend` was sent a prompt of these blocks: its cache will hold them."""
        where = self._where
        for h in blocks:
            where[h] = backend
            where.move_to_end(h)
        while len(where) > self._max:
            where.popitem(last=False)

    def forget(self, backend: str) -> None:
        """`backend` left the fleet (or lost its cache): nothing is routed to it for affinity."""
        for h in [h for h, b in self._where.items() if b == backend]:
            del self._where[h]
