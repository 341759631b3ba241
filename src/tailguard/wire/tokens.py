"""Deterministic prompt-token estimate shared by the simulator, the gateway and the bench; no I/O.

Real tokenizers differ per model, so every part of tailguard uses one documented approximation:
one token per 4 bytes of UTF-8 text (rounded up), plus a fixed overhead per chat message for the
chat template. A request that carries token ids is counted exactly.
"""

from __future__ import annotations

import random

BYTES_PER_TOKEN = 4
CHAT_MESSAGE_OVERHEAD_TOKENS = 4

_WORDS = (
    "the of and to in is for on that with as by this from be are at or an it not was which have "
    "model token batch queue latency server request stream cache prefill decode tail class chat "
    "summary report data system user reply answer time value result engine gateway load test"
).split()


def text_tokens(text: str) -> int:
    """Estimated tokens of a piece of text: ceil(UTF-8 bytes / 4)."""
    n = len(text)
    if not text.isascii():
        n = len(text.encode("utf-8"))
    return (n + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN


def parts_text(content: object) -> str:
    """The text of a message's content: a string, or the `text` of each part of a list (OpenAI's
    content parts, Anthropic's content blocks, the Responses API's input items); else ""."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def synthetic_text(n_tokens: int, rng: random.Random | None = None) -> str:
    """Text that `text_tokens` counts as exactly `n_tokens` (ASCII words, padded to 4*n bytes)."""
    if n_tokens <= 0:
        return ""
    rng = rng or random.Random(0)
    target = n_tokens * BYTES_PER_TOKEN
    parts: list[str] = []
    size = 0
    while size < target:
        w = rng.choice(_WORDS)
        parts.append(w)
        size += len(w) + 1
    text = " ".join(parts)[:target]
    return text.ljust(target, ".")
