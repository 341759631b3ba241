"""KV-cache blocks and the prefix cache of the simulated engine; pure, no I/O.

Capacity is counted in blocks of `block_size` tokens, as vLLM's paged attention does. The model
needs counts, not addresses: a sequence holds some private blocks (its own, not shareable) and
references to cached blocks, which are keyed by a chained hash of their content (block i's key
depends on blocks 0..i, so equal keys mean equal prefixes). A cached block nobody references is
still free capacity: it is evicted, least recently released first, when a private block is needed,
and reused without prefill when a later request's prompt starts with the same blocks.

Block keys come from `text_block_hashes` (prompt text: one block is `block_size` tokens of 4 bytes
each, the same approximation as `tailguard.wire.tokens`), `token_block_hashes` (token ids) or
`prefix_block_hashes` (a named shared prefix of a synthetic workload).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Iterable, Sequence

from tailguard.wire.tokens import BYTES_PER_TOKEN

_MASK = (1 << 63) - 1


def chain_hashes(blocks: Iterable[bytes], parent: int = 0) -> tuple[int, ...]:
    """Chained 63-bit content keys: a block's key covers its own bytes and every block before it."""
    out: list[int] = []
    h = parent
    for content in blocks:
        digest = hashlib.blake2b(h.to_bytes(8, "little") + content, digest_size=8).digest()
        h = int.from_bytes(digest, "little") & _MASK
        out.append(h)
    return tuple(out)


def text_block_hashes(text: str, block_size: int = 16, max_blocks: int | None = None) -> tuple[int, ...]:
    """Keys of the full blocks of a prompt given as text (block = block_size * 4 bytes of UTF-8)."""
    data = text.encode("utf-8")
    step = block_size * BYTES_PER_TOKEN
    n = len(data) // step
    if max_blocks is not None:
        n = min(n, max_blocks)
    return chain_hashes(data[i * step:(i + 1) * step] for i in range(n))


def token_block_hashes(token_ids: Sequence[int], block_size: int = 16) -> tuple[int, ...]:
    """Keys of the full blocks of a prompt given as token ids."""
    n = len(token_ids) // block_size
    return chain_hashes(
        ",".join(map(str, token_ids[i * block_size:(i + 1) * block_size])).encode() for i in range(n)
    )


def prefix_block_hashes(key: str, prefix_tokens: int, block_size: int = 16) -> tuple[int, ...]:
    """Keys for a synthetic shared prefix named `key` (a system prompt, a document) of `prefix_tokens`."""
    base = key.encode("utf-8")
    return chain_hashes(base + i.to_bytes(4, "little") for i in range(prefix_tokens // block_size))


class KVCache:
    """Block accounting with an LRU prefix cache.

        kv = KVCache(num_blocks=1000, enable_prefix_caching=True)
        hit_blocks, evictable_hits = kv.lookup(keys, max_blocks=len(keys))
        kv.acquire(keys[:hit_blocks]); kv.allocate(n_private)      # admission
        kv.promote(key)        # a private block just filled with a shareable prefix block
        kv.release(n_private, held_keys)                            # finish or preemption
    """

    __slots__ = ("num_blocks", "enable_prefix_caching", "_free", "_refs", "_evictable", "evictions")

    def __init__(self, num_blocks: int, enable_prefix_caching: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._free = num_blocks  # blocks holding nothing anyone can reuse
        self._refs: dict[int, int] = {}  # key -> number of sequences holding that cached block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.evictions = 0

    @property
    def free_blocks(self) -> int:
        """Blocks available to `allocate` (truly free plus evictable cached ones)."""
        return self._free + len(self._evictable)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self._free - len(self._evictable)

    @property
    def cached_blocks(self) -> int:
        return len(self._refs)

    def referenced_cached_blocks(self) -> int:
        """Cached blocks some sequence holds (O(n): for audits, not for the hot path)."""
        return sum(1 for r in self._refs.values() if r > 0)

    def usage(self) -> float:
        """Fraction of blocks held by sequences, as vLLM's kv_cache_usage_perc (0..1)."""
        return self.used_blocks / self.num_blocks

    def allocate(self, n: int) -> bool:
        """Take `n` private blocks, evicting cached blocks if needed; False (and no change) if short."""
        if n <= 0:
            return True
        free = self._free
        if n <= free:
            self._free = free - n
            return True
        if n > free + len(self._evictable):
            return False
        self._free = 0
        for _ in range(n - free):
            key, _none = self._evictable.popitem(last=False)
            del self._refs[key]
            self.evictions += 1
        return True

    def lookup(self, keys: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """How many leading `keys` are cached (at most `max_blocks`), and how many of those are
        unreferenced (acquiring them takes them out of the free pool). No side effects."""
        if not self.enable_prefix_caching:
            return 0, 0
        refs = self._refs
        hits = evictable = 0
        for key in keys[:max_blocks]:
            r = refs.get(key)
            if r is None:
                break
            hits += 1
            if r == 0:
                evictable += 1
        return hits, evictable

    def acquire(self, keys: Iterable[int]) -> None:
        """Reference cached blocks found by `lookup`."""
        refs = self._refs
        for key in keys:
            r = refs[key]
            if r == 0:
                del self._evictable[key]
            refs[key] = r + 1

    def promote(self, key: int) -> bool:
        """Turn one of the caller's private blocks, now full, into the cached block `key`. False if
        `key` is already cached (another sequence computed the same block): the caller keeps its
        block private, as a duplicate nobody else will find."""
        if not self.enable_prefix_caching or key in self._refs:
            return False
        self._refs[key] = 1
        return True

    def release(self, private_blocks: int, keys: Iterable[int] = ()) -> None:
        """Give back private blocks and drop references to cached ones. Pass keys last block first:
        the tail of a prefix is then evicted before its head, which more requests share."""
        self._free += private_blocks
        refs = self._refs
        for key in keys:
            r = refs[key] - 1
            refs[key] = r
            if r == 0:
                self._evictable[key] = None
