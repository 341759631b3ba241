"""What a request asks for and what each streamed chunk carries, as far as deadlines care: is it
content (text, reasoning, tool calls), and the final usage. Pure: no I/O.

Content is what moves the first-token and idle deadlines. The role-only first chunk, SSE
comments (`: keep-alive`) and an empty delta are not progress: a server that sends only those
is stalled, however many bytes it sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from tailguard.wire.sse import DONE, SSEDecoder

_CONTENT_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls", "text")


@dataclass(frozen=True, slots=True)
class RequestFields:
    endpoint: Literal["chat", "completions"] | None  # None: not a generation, nothing streams
    stream: bool  # the caller asked for a stream
    max_tokens: int | None

    @property
    def assembles(self) -> bool:
        """A non-stream generation, sent as a stream and joined back (see `assembly`)."""
        return self.endpoint is not None and not self.stream


def request_fields(method: str, path: str, body: bytes) -> RequestFields:
    """The fields deadlines depend on; anything but a JSON POST to a generation endpoint asks
    for nothing."""
    endpoint: Literal["chat", "completions"] | None = (
        "chat" if path.endswith("/chat/completions") else "completions" if path.endswith("/completions") else None)
    try:
        obj = json.loads(body) if body and method == "POST" and endpoint else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return RequestFields(endpoint=None, stream=False, max_tokens=None)
    limit = obj.get("max_completion_tokens", obj.get("max_tokens"))
    max_tokens = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    return RequestFields(endpoint=endpoint, stream=obj.get("stream") is True, max_tokens=max_tokens)


class StreamScan:
    """Reads a chat or completions SSE stream incrementally and counts its content chunks.

        scan = StreamScan()
        if scan.feed(raw_bytes): ...   # this piece completed at least one content chunk
        scan.tokens()                  # usage.completion_tokens if sent, else content chunks
    """

    __slots__ = ("_decoder", "content_chunks", "completion_tokens", "done")

    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self.content_chunks = 0
        self.completion_tokens: int | None = None
        self.done = False  # `data: [DONE]` arrived: the answer is whole

    def feed(self, data: bytes) -> int:
        """Content chunks completed by `data`."""
        found = 0
        for event in self._decoder.feed(data):
            if event.data == DONE:
                self.done = True
                continue
            try:
                obj = json.loads(event.data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                found += _has_content(obj)
                self._read_usage(obj)
        self.content_chunks += found
        return found

    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.content_chunks

    def _read_usage(self, obj: dict[str, Any]) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.completion_tokens = usage["completion_tokens"]


def _has_content(obj: dict[str, Any]) -> bool:
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        part = choice.get("delta", choice)
        if isinstance(part, dict) and any(part.get(k) for k in _CONTENT_KEYS):
            return True
    return False
