"""What the simulator answers, as bytes: every generated token is TOKEN_TEXT; the SSE events of a
streamed answer (`Chunks`) and the JSON body of a whole one (`response_body`); pure, no I/O.
"""

from __future__ import annotations

from tailguard.wire import openai as wire
from tailguard.wire.sse import DONE_EVENT, encode_event

TOKEN_TEXT = " tok"  # one token by the bytes/4 estimate


class Chunks:
    """The events of one streamed response, the per-token ones encoded once: a streamed token
    costs one pre-encoded chunk and, per engine step, one write.

        chunks = Chunks("chat", rid, model, created, prompt_tokens=12, include_usage=True)
        chunks.more(sent=0, n=3)                    # role chunk + 3 tokens
        chunks.end(sent=3, n=2, reason="length")    # 1 token, the last one with its finish_reason, usage, [DONE]
    """

    __slots__ = ("endpoint", "rid", "model", "created", "prompt_tokens", "include_usage", "role", "token")

    def __init__(self, endpoint: wire.Endpoint, rid: str, model: str, created: int, *,
                 prompt_tokens: int, include_usage: bool) -> None:
        self.endpoint = endpoint
        self.rid, self.model, self.created = rid, model, created
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        if endpoint == "chat":
            self.role = encode_event(wire.chat_chunk(rid, model, created, role="assistant"))
            self.token = encode_event(wire.chat_chunk(rid, model, created, content=TOKEN_TEXT))
        else:
            self.role = b""
            self.token = encode_event(wire.completion_chunk(rid, model, created, text=TOKEN_TEXT))

    def more(self, sent: int, n: int) -> bytes:
        """`n` more tokens after the `sent` ones already written; the first open with the role."""
        return self.role + self.token * n if sent == 0 and n > 0 else self.token * n

    def end(self, sent: int, n: int, reason: str) -> bytes:
        """The last `n` tokens after `sent` (the final one in the chunk that carries
        `finish_reason`), the usage chunk when asked for, and `[DONE]`."""
        parts = [self.role] if sent == 0 and n > 0 else []
        parts.append(self.token * (n - 1) if n > 0 else b"")
        parts.append(self._final(reason, with_token=n > 0))
        if self.include_usage:
            parts.append(self._usage(sent + n))
        parts.append(DONE_EVENT)
        return b"".join(parts)

    def _final(self, reason: str, with_token: bool) -> bytes:
        if self.endpoint == "chat":
            return encode_event(wire.chat_chunk(self.rid, self.model, self.created,
                                                content=TOKEN_TEXT if with_token else None, finish_reason=reason))
        return encode_event(wire.completion_chunk(self.rid, self.model, self.created,
                                                  text=TOKEN_TEXT if with_token else "", finish_reason=reason))

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
