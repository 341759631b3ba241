"""Prompt text for a trace that has none: exactly the trace's token count as tailguard counts
tokens (`wire.tokens`: 4 ASCII bytes a token), and, where the trace names the prompt's blocks
(Mooncake's `hash_ids`), one deterministic text per block, so requests that shared KV blocks in
production share a text prefix here and a prefix cache sees the same reuse; pure, no I/O.

AIPerf does the same for Mooncake traces (`aiperf/dataset/loader/base_trace_loader.py`: a token
sequence per hash id, cached, the last block cut to the prompt's length, a prompt longer than its
ids padded with fresh tokens); here the blocks are text, since the gateway and the simulator count
text. Every block and every request's own text starts with a tag naming it (and the run's seed),
so two different blocks never share even their first bytes: a prefix cache finds exactly the
reuse the trace has, and a run with another seed finds nothing the last one left cached.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence

from tailguard.bench.trace.request import TraceRequest
from tailguard.wire.tokens import BYTES_PER_TOKEN, synthetic_text

_POOL_TOKENS = 1 << 15  # 128 KiB of text that every block and request takes a slice of
_CACHED_BLOCKS = 4096  # blocks kept ready (8 MiB at Mooncake's 512 tokens): a hot prefix is built once


class PromptText:
    """Text for a trace's prompts. `text(index, hash_ids, tokens)` is `tokens` tokens long: the
    blocks `hash_ids` names (each `block_tokens` long, the last cut to fit), then text of the
    request's own for the rest.

        texts = PromptText(seed=0, block_tokens=512)
        texts.text(7, (0, 1, 9), 1300)   # blocks 0 and 1 whole, 276 tokens of block 9
    """

    def __init__(self, seed: int, block_tokens: int = 0, trace: str = "") -> None:
        self.seed = seed
        self.block_tokens = block_tokens
        # A request's own text is named by the trace too: two traces replayed with one seed on one
        # server share nothing (blocks are the trace's own ids, so they are named by it as well).
        self._name = f"{seed}.{trace}" if trace else str(seed)
        self._pool = synthetic_text(_POOL_TOKENS, random.Random(f"{seed}:trace-text"))
        self._blocks: OrderedDict[int, str] = OrderedDict()

    def _slice(self, tag: str, key: str, n_bytes: int) -> str:
        span = len(self._pool) - n_bytes
        if span <= 0:
            body = synthetic_text(-(-n_bytes // BYTES_PER_TOKEN), random.Random(key))
        else:
            start = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % span
            body = self._pool[start:start + n_bytes]
        return (tag + body)[:n_bytes]

    def block(self, hash_id: int) -> str:
        """Block `hash_id`'s text: the same for every request that names it."""
        text = self._blocks.get(hash_id)
        if text is None:
            text = self._slice(f"[{self._name}.{hash_id}] ", f"{self._name}:block:{hash_id}",
                               self.block_tokens * BYTES_PER_TOKEN)
            self._blocks[hash_id] = text
            if len(self._blocks) > _CACHED_BLOCKS:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(hash_id)
        return text

    def text(self, index: int, hash_ids: Sequence[int], tokens: int) -> str:
        parts: list[str] = []
        left = tokens
        for h in hash_ids:
            if left <= 0:
                break
            take = min(self.block_tokens, left)
            block = self.block(h)
            parts.append(block if take == self.block_tokens else block[:take * BYTES_PER_TOKEN])
            left -= take
        if left > 0:
            parts.append(self._slice(f"<{self._name}.{index}> ", f"{self._name}:own:{index}", left * BYTES_PER_TOKEN))
        return "".join(parts)


def block_reuse(requests: Sequence[TraceRequest], block_tokens: int) -> float | None:
    """The trace's own prefix reuse: the share of its prompt tokens in blocks an earlier request
    already had, counted as a prefix cache counts them (a request's leading run of such blocks;
    a block seen only shorter before is reused as far as it went). None without blocks."""
    if block_tokens <= 0 or not any(r.hash_ids for r in requests):
        return None
    seen: dict[int, int] = {}  # block id -> the most of it any request had
    reused = total = 0
    for r in requests:
        total += r.input_tokens
        leading = True
        for k, h in enumerate(r.hash_ids):
            size = min(block_tokens, r.input_tokens - k * block_tokens)
            if size <= 0:
                break
            had = seen.get(h, 0)
            if leading and had:
                reused += min(size, had)
            leading = leading and had >= size
            seen[h] = max(had, size)
    return reused / total if total else 0.0
