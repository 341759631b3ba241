"""Token ids in a stream: what vLLM's `return_token_ids` adds to its chunks, read for a continuation
by token ids and cut from what the client gets; and a completions chunk put in chat's shape, for a
chat stream continued through `/v1/completions`. Pure, no I/O.

With `return_token_ids: true`, vLLM (0.10.2 and later) puts the prompt's ids as `prompt_token_ids`
on a stream's first chunk and each chunk's generated ids as `token_ids` on its choice. The
gateway asks for them itself (`gateway.upstream.resume`), so a client that did not ask must not
see them: `without_token_ids` cuts both keys from the bytes, with a `find` per key and nothing
parsed.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import orjson

_KEYS = (b'"token_ids":', b'"prompt_token_ids":')
_COMPACT_IDS = b'"token_ids":['  # (not `"prompt_token_ids":[`: the quote comes right before)
_COMMA, _SPACE, _BRACKET_OPEN = 0x2C, 0x20, 0x5B


def without_token_ids(data: bytes) -> bytes:
    """`data` (whole SSE events) without any `token_ids` or `prompt_token_ids` member. A value is a
    list of integers or `null`: it ends at the first `]` or after `null`."""
    if b'token_ids":' not in data:
        return data
    for key in _KEYS:
        i = data.find(key)
        while i >= 0:
            j = i + len(key)
            while j < len(data) and data[j] == _SPACE:
                j += 1
            if data.startswith(b"null", j):
                end = j + 4
            elif j < len(data) and data[j] == _BRACKET_OPEN:
                end = data.find(b"]", j) + 1
                if end == 0:
                    return data  # not a whole member: leave the bytes alone
            else:
                return data
            start = i
            k = i - 1
            while k >= 0 and data[k] == _SPACE:
                k -= 1
            if k >= 0 and data[k] == _COMMA:
                start = k  # `,"token_ids":[..]`: the comma before it goes
            elif end < len(data) and data[end] == _COMMA:
                end += 1  # `{"token_ids":[..],`: the comma after it goes
            data = data[:start] + data[end:]
            i = data.find(key, start)
    return data


def ids_in(event: bytes) -> list[int] | None:
    """The generated ids of one whole compact event, found by its bytes (a relay's fast path, as
    `wire.chunks.content_text` reads its text), or None where only a parse can tell."""
    i = event.find(_COMPACT_IDS)
    if i < 0 or event.find(_COMPACT_IDS, i + 1) >= 0:
        return None
    start = i + len(_COMPACT_IDS) - 1
    end = event.find(b"]", start)
    try:
        ids = orjson.loads(event[start:end + 1]) if end > 0 else None
    except orjson.JSONDecodeError:
        return None
    return ids if _int_list(ids) else None


def _first_choice(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A parsed chunk's first choice, or None when it has none."""
    choices = obj.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None


def generated_ids(obj: dict[str, Any]) -> list[int] | None:
    """The generated token ids of a parsed chunk's first choice, or None when it has none."""
    c = _first_choice(obj)
    ids = c.get("token_ids") if c is not None else None
    return ids if _int_list(ids) else None


def shows_text(obj: dict[str, Any]) -> bool:
    """The chunk's first choice carries text (chat's `delta.content` or a completion's `text`)."""
    c = _first_choice(obj)
    if c is None:
        return False
    delta = c.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else c.get("text")
    return isinstance(text, str) and text != ""


def prompt_ids(obj: dict[str, Any]) -> list[int] | None:
    """The prompt's token ids a stream's first chunk carries (on the chunk, or on its first
    choice as vLLM's completions send them), or None."""
    ids = obj.get("prompt_token_ids")
    if _int_list(ids):
        return ids
    c = _first_choice(obj)
    ids = c.get("prompt_token_ids") if c is not None else None
    return ids if _int_list(ids) else None


def as_chat_chunk(obj: dict[str, Any]) -> dict[str, Any]:
    """A completions chunk in chat's shape: each choice's `text` as its delta's `content`. A
    chat stream continued by token ids runs on `/v1/completions` (chat takes no token-id prompt),
    and its client must go on seeing chat chunks."""
    out = {**obj, "object": "chat.completion.chunk"}
    choices = obj.get("choices")
    if isinstance(choices, list):
        out["choices"] = [_chat_choice(c) if isinstance(c, dict) else c for c in choices]
    return out


def _chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    text = choice.get("text")
    out = {k: v for k, v in choice.items() if k not in ("text", "prompt_token_ids")}
    out["delta"] = {"content": text} if isinstance(text, str) and text else {}
    out.setdefault("logprobs", None)
    return out


def _int_list(v: Any) -> TypeGuard[list[int]]:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
