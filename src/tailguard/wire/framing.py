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

from tailguard.errors import APIError
from tailguard.wire import anthropic, chunks, embeddings, responses
from tailguard.wire.openai import Endpoint, error_body
from tailguard.wire.sse import is_done

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


def _openai_error(err: APIError) -> bytes:
    return b"data: " + error_body(err) + b"\n\n"


def _typed(read: Callable[[chunks.Usage, Any], None]) -> Callable[[chunks.Usage, Any], bool]:
    def read_usage(usage: chunks.Usage, obj: Any) -> bool:
        read(usage, obj)
        return False
    return read_usage


OPENAI = Framing(chunks.has_content, chunks.has_usage, chunks.is_error, is_done, chunks.Usage.read, _openai_error)
RESPONSES = Framing(responses.has_content, responses.has_usage, responses.is_error, responses.is_last,
                    _typed(responses.read_usage), responses.error_event)
MESSAGES = Framing(anthropic.has_content, anthropic.has_usage, anthropic.is_error, anthropic.is_last,
                   _typed(anthropic.read_usage), anthropic.error_event)

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
