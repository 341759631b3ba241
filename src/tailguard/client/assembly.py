"""A non-stream call sent as a stream: the request rewritten to stream, and the chunks joined back
into the response body the caller asked for. Pure: no I/O.

Streaming underneath is what gives a non-stream call the same deadlines as a stream (a server
answering `stream: false` sends nothing until it is done, so a first token or a stall cannot be
seen), and, since nothing reaches the caller before the end, lets any failed try be retried.
"""

from __future__ import annotations

import json

from tailguard.wire.join import ChunkJoiner
from tailguard.wire.sse import DONE, SSEDecoder, SSEEvent


def streaming_body(body: bytes) -> bytes:
    """The same request, streamed, with usage in the last chunk."""
    obj = json.loads(body)
    obj["stream"] = True
    obj["stream_options"] = {**(obj.get("stream_options") or {}), "include_usage": True}
    return json.dumps(obj).encode()


class Assembler:
    """Joins chat or completions chunks into one response object (`wire.join`, as the gateway
    does), from the bytes of the stream.

        asm = Assembler(chat=True)
        asm.feed(raw_bytes) ...
        body = asm.finish()        # what the server would have answered to `stream: false`
    """

    def __init__(self, chat: bool) -> None:
        self._decoder = SSEDecoder()
        self._joiner = ChunkJoiner(chat)

    def feed(self, data: bytes) -> None:
        self._take(self._decoder.feed(data))

    def finish(self) -> bytes:
        """The body, with a last event that came without its blank line."""
        self._take(self._decoder.flush())
        return json.dumps(self._joiner.finish()).encode()

    def _take(self, events: list[SSEEvent]) -> None:
        for event in events:
            if event.data == DONE:
                continue
            obj = json.loads(event.data)
            if isinstance(obj, dict):
                self._joiner.feed(obj)
