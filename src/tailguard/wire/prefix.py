"""A prompt as chained block hashes, for prefix-affine routing (`tailguard.front.prefix`); pure.

The prompt's text (a chat's messages flattened with their roles, as `ParsedRequest.prompt_text`
renders them) is cut into blocks of `BLOCK_CHARS` characters; block i's hash covers block i and
every block before it, so two prompts share their first k blocks exactly when their first k
hashes are equal, and the router can ask "who served the longest part of this prompt" with one
lookup per block (vLLM keys its prefix cache the same way, per block of tokens). Only full blocks
count, and at most `MAX_BLOCKS` of them (the first 32 K characters): enough to tell a shared
system prompt or conversation apart, and a bounded cost per request (about 2 us per block).

Python's own `hash` is used: it is randomised per process, which is fine for an index that lives
in one process (the recording keeps the values it was given).
"""

from __future__ import annotations

BLOCK_CHARS = 256  # about 64 tokens
MAX_BLOCKS = 128


def prefix_blocks(text: str) -> tuple[int, ...]:
    """The chained hashes of the full blocks of `text` (at most `MAX_BLOCKS`)."""
    n = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    out = []
    h = 0
    for i in range(n):
        h = hash((h, text[i * BLOCK_CHARS:(i + 1) * BLOCK_CHARS]))
        out.append(h)
    return tuple(out)
