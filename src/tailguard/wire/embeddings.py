"""Embeddings and the engines' other pooling and tokenizer routes on the wire (`/v1/embeddings`,
`/v1/rerank` and `/rerank`, `/score`, `/tokenize`, `/detokenize`): a request's size in input
tokens, the embeddings answer, and its usage; pure, no I/O.

These answer once (no stream) and generate nothing, so a job is its input: an embeddings request
of many inputs is one job sized by all of them (vLLM batches them into one engine request too,
`entrypoints/openai/serving_embedding.py`). The other routes are forwarded as they came; their
size is the text and token ids their body carries.
"""

from __future__ import annotations

import array
import base64
import sys
from typing import Any

import orjson

from tailguard.errors import BadRequest
from tailguard.wire.chunks import Usage
from tailguard.wire.tokens import text_tokens

# Fields that carry what a pooling or tokenizer route reads (vLLM's and llama-server's names).
_INPUT_FIELDS = ("input", "query", "documents", "text_1", "text_2", "queries", "prompt", "messages", "tokens",
                 "content")


def inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """An embeddings request's inputs, each a text or token ids; raises `BadRequest` otherwise."""
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(_is_int(v) for v in value):
            return [list(value)]
        if all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value):
            return [list(v) for v in value]
    raise BadRequest("'input' must be a string, an array of strings, an array of token ids or an array of "
                     "arrays of token ids, not empty.", param="input", code="invalid_type")


def input_tokens(body: dict[str, Any]) -> int:
    """The input of a pooling or tokenizer request, in tokens: texts by the bytes/4 estimate,
    token ids counted, in every field such a route reads; a rerank's query (a score's one
    `text_1`) once per document, as the engine scores each pair (`_repeated`)."""
    return max(1, sum(_tokens(body.get(name)) for name in _INPUT_FIELDS) + _repeated(body))


def _repeated(body: dict[str, Any]) -> int:
    """The tokens a cross-encoder reads again beyond the first pair: the query with every other
    document. A body of another shape adds nothing (the engine judges it)."""
    for one, many in (("query", "documents"), ("text_1", "text_2")):
        first, rest = body.get(one), body.get(many)
        if isinstance(first, list) and len(first) == 1:
            first = first[0]
        if isinstance(first, str) and isinstance(rest, list) and len(rest) > 1:
            return _tokens(first) * (len(rest) - 1)
    return 0


def _tokens(value: Any) -> int:
    if isinstance(value, str):
        return text_tokens(value)
    if _is_int(value):
        return 1
    if isinstance(value, list):
        return sum(_tokens(v) for v in value)
    if isinstance(value, dict):
        return sum(_tokens(v) for v in value.values())
    return 0


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_usage(usage: Usage, obj: Any) -> None:
    """An answer's `usage.prompt_tokens` (embeddings, rerank, score): its input; nothing generated."""
    u = obj.get("usage") if isinstance(obj, dict) else None
    if isinstance(u, dict):
        pt = u.get("prompt_tokens", u.get("total_tokens"))
        if _is_int(pt):
            usage.prompt_tokens = pt
    usage.completion_tokens = 0


def embeddings_body(model: str, vectors: list[list[float]], prompt_tokens: int, base64_floats: bool) -> bytes:
    """OpenAI's embeddings answer; `base64_floats`: each vector as base64 of little-endian
    float32 (what the openai SDK asks for by default and decodes)."""
    data = []
    for i, v in enumerate(vectors):
        if base64_floats:
            packed = array.array("f", v)
            if sys.byteorder == "big":
                packed.byteswap()
            emb: Any = base64.b64encode(packed.tobytes()).decode()
        else:
            emb = v
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return orjson.dumps({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
