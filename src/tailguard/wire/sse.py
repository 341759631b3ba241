"""Server-sent events on the wire: an incremental decoder and the encoder; pure, no I/O.

The decoder works on bytes and never parses JSON: callers that relay a stream look at the raw
`data` of each event and parse only what they need (usually just the final usage chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(slots=True, frozen=True)
class SSEEvent:
    data: bytes
    event: str | None = None
    raw: bytes = b""


class SSEDecoder:
    """Splits a byte stream into events; keeps a partial event between `feed` calls.

        decoder = SSEDecoder()
        for chunk in response_chunks:
            for ev in decoder.feed(chunk):
                handle(ev.data)
        tail = decoder.flush()
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[SSEEvent]:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[SSEEvent] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            block = buf[start:end]
            start = end + 2
            ev = _parse_block(block)
            if ev is not None:
                events.append(ev)
        self._buf = buf[start:]
        return events

    def flush(self) -> list[SSEEvent]:
        block, self._buf = self._buf, b""
        ev = _parse_block(block.strip(b"\n"))
        return [ev] if ev is not None else []


def _parse_block(block: bytes) -> SSEEvent | None:
    data_lines: list[bytes] = []
    event: str | None = None
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data_lines.append(value)
        elif field == b"event":
            event = value.decode("utf-8", "replace")
    if not data_lines and event is None:
        return None
    return SSEEvent(data=b"\n".join(data_lines), event=event, raw=block + b"\n\n")


def encode_event(data: bytes) -> bytes:
    """One `data:` event; `data` must not contain a blank line (JSON from orjson never does)."""
    return b"data: " + data + b"\n\n"
