"""What the simulator's pooling and tokenizer routes cost and answer, in vLLM's shapes
(`entrypoints/openai/protocol.py`: `RerankResponse`, `ScoreResponse`, `TokenizeResponse`,
`DetokenizeResponse`); pure, no I/O.

Cost: as in vLLM, embeddings, rerank and score run on the engine, one prefill of one step per
input (an embeddings input; a query and document pair of a cross-encoder's rerank or score), so
`prefills` sizes each by its input tokens and the server adds them to the engine as it does
generation. `/tokenize` and `/detokenize` are answered by vLLM's API server with the tokenizer
alone, never reaching the engine: `prefills` gives none, and they cost the engine nothing.

Scores are deterministic: the cosine of the two texts' vectors (`sim.vectors`) mapped to 0..1,
so the same pair always scores the same. The simulator has no vocabulary: `/tokenize` gives one
made-up id per estimated token (`token_ids`), and `/detokenize` turns every id into TOKEN_TEXT.

    sizes = prefills("rerank", body)     # engine requests to run, each of this many prompt tokens
    body = answer("rerank", body, model, rid, created, max_model_len)
"""

from __future__ import annotations

from typing import Any

import orjson

from tailguard.errors import BadRequest
from tailguard.sim.answer import TOKEN_TEXT
from tailguard.sim.vectors import vector
from tailguard.wire.embeddings import inputs
from tailguard.wire.openai import Endpoint, usage_dict
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, parts_text, text_tokens

ID_PREFIXES: dict[str, str] = {"embeddings": "embd", "rerank": "rerank", "score": "score"}


def prefills(endpoint: Endpoint, body: dict[str, Any]) -> list[int]:
    """The engine requests `body` makes, each as its prompt tokens; raises `BadRequest`."""
    if endpoint == "embeddings":
        return [max(1, len(i) if isinstance(i, list) else text_tokens(i)) for i in inputs(body)]
    if endpoint in ("rerank", "score"):
        return [max(1, text_tokens(a) + text_tokens(b)) for a, b in pairs(endpoint, body)]
    _tokenizer_request(endpoint, body)
    return []


def pairs(endpoint: Endpoint, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The (query, document) pairs a rerank or score request scores, as vLLM pairs them: a rerank's
    query with each document; a score's `text_1` with each `text_2` when it is one text, else
    `text_1[i]` with `text_2[i]` (the lists must be as long)."""
    if endpoint == "rerank":
        query = _text(body, "query")
        return [(query, d) for d in _texts(body, "documents")]
    one, two = _texts(body, "text_1"), _texts(body, "text_2")
    if len(one) == 1:
        return [(one[0], t) for t in two]
    if len(one) != len(two):
        raise BadRequest(f"'text_1' has {len(one)} texts and 'text_2' {len(two)}: give one 'text_1' or as many "
                         "as 'text_2'.", param="text_1", code="invalid_value")
    return list(zip(one, two))


def answer(endpoint: Endpoint, body: dict[str, Any], model: str, rid: str, created: int,
           max_model_len: int) -> bytes:
    """The JSON answer of a rerank, score, tokenize or detokenize request (embeddings are
    `wire.embeddings.embeddings_body`)."""
    if endpoint == "rerank":
        return _rerank(body, model, rid)
    if endpoint == "score":
        return _score(body, model, rid, created)
    if endpoint == "tokenize":
        ids = _tokenize(body)
        return orjson.dumps({"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None})
    return orjson.dumps({"prompt": TOKEN_TEXT * len(_token_list(body))})


def score(a: str, b: str) -> float:
    """How alike two texts are, in 0..1: the cosine of their vectors, mapped."""
    return round((1.0 + sum(x * y for x, y in zip(vector(a), vector(b)))) / 2.0, 6)


def token_ids(text: str, count: int | None = None) -> list[int]:
    """`count` made-up ids (by default one per estimated token of `text`), each from a 4-byte
    piece of it: the same for the same text (the simulator has no vocabulary)."""
    raw = text.encode()
    n = text_tokens(text) if count is None else count
    return [1 + (int.from_bytes(raw[4 * i:4 * i + 4] or b"\0", "little") % 32000) for i in range(n)]


def _rerank(body: dict[str, Any], model: str, rid: str) -> bytes:
    scored = [(i, d, score(q, d)) for i, (q, d) in enumerate(pairs("rerank", body))]
    scored.sort(key=lambda r: -r[2])
    top_n = body.get("top_n") or 0
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise BadRequest("'top_n' must be a non-negative integer.", param="top_n", code="invalid_value")
    kept = scored[:top_n] if top_n else scored
    tokens = sum(prefills("rerank", body))
    return orjson.dumps({
        "id": rid, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [{"index": i, "document": {"text": d, "multi_modal": None}, "relevance_score": s}
                    for i, d, s in kept]})


def _score(body: dict[str, Any], model: str, rid: str, created: int) -> bytes:
    found = pairs("score", body)
    tokens = sum(prefills("score", body))
    return orjson.dumps({
        "id": rid, "object": "list", "created": created, "model": model,
        "data": [{"index": i, "object": "score", "score": score(a, b)} for i, (a, b) in enumerate(found)],
        "usage": usage_dict(tokens, 0)})


def _tokenizer_request(endpoint: Endpoint, body: dict[str, Any]) -> None:
    if endpoint == "tokenize":
        _tokenize(body)
    elif endpoint == "detokenize":
        _token_list(body)
    else:
        raise ValueError(f"not a pooling route: {endpoint}")


def _tokenize(body: dict[str, Any]) -> list[int]:
    """A `/tokenize` body's ids: of its `prompt`, or of its chat `messages` (vLLM's two forms),
    each message counted as the gateway counts one (its text and the chat template's overhead)."""
    if isinstance(body.get("prompt"), str):
        return token_ids(body["prompt"])
    messages = body.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        pad = "." * (4 * CHAT_MESSAGE_OVERHEAD_TOKENS)  # exactly CHAT_MESSAGE_OVERHEAD_TOKENS tokens
        return [t for m in messages for t in token_ids(pad + parts_text(m.get("content")))]
    raise BadRequest("'prompt' (a string) or 'messages' (an array of messages) is required.", param="prompt",
                     code="missing_required_parameter")


def _token_list(body: dict[str, Any]) -> list[int]:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in tokens):
        raise BadRequest("'tokens' must be an array of token ids.", param="tokens", code="invalid_type")
    return tokens


def _text(body: dict[str, Any], name: str) -> str:
    v = body.get(name)
    if not isinstance(v, str):
        raise BadRequest(f"'{name}' must be a string.", param=name, code="invalid_type")
    return v


def _texts(body: dict[str, Any], name: str) -> list[str]:
    v = body.get(name)
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(t, str) for t in v):
        return list(v)
    raise BadRequest(f"'{name}' must be a string or a non-empty array of strings.", param=name, code="invalid_type")
