"""How each route's stream says what it carries, in one table the relay reads: which events are
generated content, which carry usage or an error, which one ends the stream, how its usage is
read and how a broken stream is ended for the client; pure, no I/O.

The SSE framing is the same for every route (`wire.sse` decodes them all); the events differ.
OpenAI's chunks (`wire.chunks`) end with `[DONE]`; the Responses API's typed events
(`wire.responses`) end with `response.completed`; Anthropic's (`wire.anthropic`) with
`message_stop`. Each test looks at an event's bytes in place, without parsing it.

    framing = FRAMINGS[endpoint]
    if framing.has_content(buf, start, end): ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from tailguard.errors import APIError
from tailguard.wire import anthropic, chunks, embeddings, responses
from tailguard.wire.openai import Endpoint, error_body
from tailguard.wire.sse import encode_event, is_done

Test = Callable[[bytes, int, int], bool]


@dataclass(frozen=True, slots=True)
class Framing:
    has_content: Test
    has_usage: Test
    is_error: Test
    is_last: Test
    # Copies an event's counts into the usage; True for a usage-only chunk a client that did not
    # ask for usage should not get (OpenAI's `"choices":[]`), never for the typed events.
    read_usage: Callable[[chunks.Usage, Any], bool]
    error_event: Callable[[APIError], bytes]  # the last event of a stream that broke mid-answer
    # What says an answer the gateway cut at its length ended there, before its error event:
    # OpenAI's `finish_reason: "length"`, the Responses API's `response.incomplete`, Anthropic's
    # `stop_reason: "max_tokens"`.
    cut_event: Callable[[Cut], bytes]


@dataclass(frozen=True, slots=True)
class Cut:
    """An answer the gateway cut at its `max_tokens` (`gateway.upstream.bound`): what the event
    that ends it carries."""

    id: str
    model: str
    choices: int
    output_tokens: int
    chat: bool = True  # chat's chunk shape, else a completion's (the OpenAI routes share a framing)


def _openai_error(err: APIError) -> bytes:
    return b"data: " + error_body(err) + b"\n\n"


def _typed(read: Callable[[chunks.Usage, Any], None]) -> Callable[[chunks.Usage, Any], bool]:
    def read_usage(usage: chunks.Usage, obj: Any) -> bool:
        read(usage, obj)
        return False
    return read_usage


def _openai_cut(cut: Cut) -> bytes:
    said: dict[str, Any] = {"delta": {}} if cut.chat else {"text": ""}
    choices = [{"index": i, **said, "logprobs": None, "finish_reason": "length"} for i in range(cut.choices)]
    return encode_event(orjson.dumps({"id": cut.id, "object": "chat.completion.chunk" if cut.chat else "text_completion",
                                      "created": 0, "model": cut.model, "choices": choices}))


def _responses_cut(cut: Cut) -> bytes:
    return responses.event("response.incomplete", {
        "type": "response.incomplete", "sequence_number": 0,
        "response": responses.response(cut.id, cut.model, 0, None, "incomplete", 0, cut.output_tokens, None)})


def _messages_cut(cut: Cut) -> bytes:
    return anthropic.event("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                             "usage": {"output_tokens": cut.output_tokens}})


OPENAI = Framing(chunks.has_content, chunks.has_usage, chunks.is_error, is_done, chunks.Usage.read, _openai_error,
                 _openai_cut)
RESPONSES = Framing(responses.has_content, responses.has_usage, responses.is_error, responses.is_last,
                    _typed(responses.read_usage), responses.error_event, _responses_cut)
MESSAGES = Framing(anthropic.has_content, anthropic.has_usage, anthropic.is_error, anthropic.is_last,
                   _typed(anthropic.read_usage), anthropic.error_event, _messages_cut)

FRAMINGS: dict[Endpoint, Framing] = {"chat": OPENAI, "completions": OPENAI, "responses": RESPONSES,
                                     "messages": MESSAGES}


def _no_usage(usage: chunks.Usage, obj: Any) -> None:
    usage.completion_tokens = 0  # a tokenizer route: the engine generated nothing


# How a whole (non-stream) answer of each other route states its usage.
ANSWER_USAGE: dict[Endpoint, Callable[[chunks.Usage, Any], None]] = {
    "responses": responses.read_usage, "messages": anthropic.read_usage, "embeddings": embeddings.read_usage,
    "rerank": embeddings.read_usage, "score": embeddings.read_usage, "tokenize": _no_usage,
    "detokenize": _no_usage,
}
