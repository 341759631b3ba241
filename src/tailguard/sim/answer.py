"""What the simulator answers, as bytes: every generated token is TOKEN_TEXT; the SSE events of a
streamed answer (`Chunks`) and the JSON body of a whole one (`response_body`); pure, no I/O.
"""

from __future__ import annotations

import orjson

from tailguard.wire import openai as wire
from tailguard.wire.sse import DONE_EVENT, encode_event

TOKEN_TEXT = " tok"  # one token by the bytes/4 estimate
TOKEN_ID = 11427  # its id, in the chunks of a request that asks for `return_token_ids` (as vLLM's)


class Chunks:
    """The events of one streamed response, the per-token ones encoded once: a streamed token
    costs one pre-encoded chunk and, per engine step, one write.

        chunks = Chunks("chat", rid, model, created, prompt_tokens=12, include_usage=True)
        chunks.more(sent=0, n=3)                    # role chunk + 3 tokens
        chunks.end(sent=3, n=2, reason="length")    # 1 token, the last one with its finish_reason, usage, [DONE]
    """

    __slots__ = ("endpoint", "rid", "model", "created", "prompt_tokens", "include_usage", "role", "token", "first",
                 "ids", "prompt_ids")

    def __init__(self, endpoint: wire.Endpoint, rid: str, model: str, created: int, *,
                 prompt_tokens: int, include_usage: bool, prompt_ids: list[int] | None = None) -> None:
        self.endpoint = endpoint
        self.rid, self.model, self.created = rid, model, created
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        # `prompt_ids`: the request asked for token ids (vLLM's `return_token_ids`): the prompt's
        # on the first chunk (chat's role chunk; a completion's first choice), each token's after.
        self.ids = prompt_ids is not None
        self.prompt_ids = prompt_ids
        if endpoint == "chat":
            self.role = _with(wire.chat_chunk(rid, model, created, role="assistant"), prompt_ids, False)
            self.token = _with(wire.chat_chunk(rid, model, created, content=TOKEN_TEXT), None, self.ids)
            self.first = self.token
        else:
            self.role = b""
            self.token = _with(wire.completion_chunk(rid, model, created, text=TOKEN_TEXT), None, self.ids)
            self.first = _with(wire.completion_chunk(rid, model, created, text=TOKEN_TEXT), prompt_ids, self.ids)

    def more(self, sent: int, n: int) -> bytes:
        """`n` more tokens after the `sent` ones already written; the first open with the role."""
        if sent == 0 and n > 0:
            return self.role + self.first + self.token * (n - 1)
        return self.token * n

    def end(self, sent: int, n: int, reason: str) -> bytes:
        """The last `n` tokens after `sent` (the final one in the chunk that carries
        `finish_reason`), the usage chunk when asked for, and `[DONE]`."""
        parts = [self.role] if sent == 0 and n > 0 else []
        if n > 1:
            parts.append(self.first + self.token * (n - 2) if sent == 0 else self.token * (n - 1))
        parts.append(self._final(reason, with_token=n > 0, first=sent == 0 and n == 1))
        if self.include_usage:
            parts.append(self._usage(sent + n))
        parts.append(DONE_EVENT)
        return b"".join(parts)

    def _final(self, reason: str, with_token: bool, first: bool) -> bytes:
        ids = self.ids and with_token
        if self.endpoint == "chat":
            return _with(wire.chat_chunk(self.rid, self.model, self.created,
                                         content=TOKEN_TEXT if with_token else None, finish_reason=reason), None, ids)
        # (a completion's only token carries the prompt's ids too, on the first chunk as ever)
        return _with(wire.completion_chunk(self.rid, self.model, self.created, text=TOKEN_TEXT if with_token else "",
                                           finish_reason=reason), self.prompt_ids if first else None, ids)

    def _usage(self, output_tokens: int) -> bytes:
        u = wire.usage_dict(self.prompt_tokens, output_tokens)
        if self.endpoint == "chat":
            return encode_event(wire.chat_chunk(self.rid, self.model, self.created, usage=u, empty_choices=True))
        return encode_event(wire.completion_chunk(self.rid, self.model, self.created, usage=u, empty_choices=True))


def response_body(endpoint: wire.Endpoint, rid: str, model: str, created: int, *,
                  prompt_tokens: int, output_tokens: int, finish_reason: str) -> bytes:
    """The JSON body of a non-streamed response of `output_tokens` tokens."""
    usage = wire.usage_dict(prompt_tokens, output_tokens)
    build = wire.chat_response if endpoint == "chat" else wire.completion_response
    return build(rid, model, created, TOKEN_TEXT * output_tokens, finish_reason, usage)


def _with(chunk: bytes, prompt_ids: list[int] | None, token_ids: bool) -> bytes:
    """`chunk` as an event, with vLLM's token-id fields where asked: the prompt's ids (on chat's
    chunk, on a completion's choice) and this token's id on its choice."""
    if prompt_ids is None and not token_ids:
        return encode_event(chunk)
    obj = orjson.loads(chunk)
    choice = obj["choices"][0] if obj["choices"] else None
    if prompt_ids is not None:
        if obj["object"] == "chat.completion.chunk":
            obj["prompt_token_ids"] = prompt_ids
        elif choice is not None:
            choice["prompt_token_ids"] = prompt_ids
    if token_ids and choice is not None:
        choice["token_ids"] = [TOKEN_ID]
    return encode_event(orjson.dumps(obj))
