"""Server-sent events on the wire: an incremental decoder and the encoder; pure, no I/O.

One framing for every reader of an upstream stream (the gateway's relays and assembler, the
bench's recorder), as the SSE spec has it: lines end in LF, CR or CRLF (CRLF is sse-starlette's
default, so FastAPI servers such as llama-cpp-python's send it); an event ends at a blank line;
`data:` with or without the space; comments; `event:`, `id:` and multi-line `data:`; an event
split across reads; and a last event cut off by EOF without its blank line (`flush`).

The decoder works on bytes and never parses JSON: callers that relay a stream look at the raw
bytes of each event and parse only what they need (usually just the final usage chunk). `frame`
is the relay's zero-copy form: whole events as one buffer of the bytes read plus their end
offsets; `feed` parses those events' fields.

Linear in the bytes received whatever an event's size: a partial event is kept as its pieces,
and each new piece is searched for an event's end on its own (with the last few bytes before
it), so the pieces are joined once, when the event is whole, not re-joined and re-scanned on
every read. With `max_event_bytes`, an event that grows past it raises `EventTooLarge`: a
backend that never ends its event cannot grow whoever reads it without bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
_DONE_BLOCKS = (b"data: [DONE]", b"data:[DONE]")
# A line end followed by a line end (a blank line) in a stream that has CRs. A CR is a line end
# of its own only when no LF follows, so the CR of a CRLF never starts a blank line.
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
# An event's end is at most 4 bytes (CRLF CRLF): a new piece ends the kept event only where an
# end starts in the kept bytes' last 3 bytes or in the piece itself.
_END_REACH = 3


class EventTooLarge(ValueError):
    """One event grew past the decoder's `max_event_bytes` without ending."""


@dataclass(slots=True, frozen=True)
class SSEEvent:
    data: bytes
    event: str | None = None
    raw: bytes = b""  # the event's bytes as they came, with their own line ends
    id: str | None = None


class SSEDecoder:
    """Splits a byte stream into events; keeps a partial event between calls.

        decoder = SSEDecoder()
        for chunk in response_chunks:
            for ev in decoder.feed(chunk):
                handle(ev.data)
        for ev in decoder.flush():   # an event EOF cut off before its blank line
            handle(ev.data)

    A relay that forwards bytes uses `frame(chunk)` and `flush_raw()` instead (see there).
    """

    __slots__ = ("_buf", "_size", "_started", "max_event_bytes")

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self._buf: list[bytes] = []  # the pieces of a partial event, in order
        self._size = 0  # their length in all
        self._started = False
        self.max_event_bytes = max_event_bytes

    def frame(self, data: bytes) -> tuple[bytes, list[int]]:
        """The whole events the stream now holds, as `(buf, ends)`: `buf` is the bytes of those
        events back to back as they came, and event i is `buf[ends[i-1]:ends[i]]` (from 0 for
        the first), blank line included. `buf` is `data` itself when `data` ends on an event's
        end and nothing was kept from before: an LF stream read event by event is never copied.
        Raises `EventTooLarge` when the event in progress passes `max_event_bytes`."""
        if self._buf:
            if not self._ends_event(data):
                self._keep(data)
                return b"", []
            buf = self._join(data)
        else:
            buf = data if self._started else self._join(data)
        # An int's `in` is one memchr, with no argument parsing (a bytes needle is first tried
        # as an index, which raises and costs more than a find): the LF-only check costs little,
        # and so does "no LF before the blank line" (a slice and a memchr cost less than `find`).
        if 0x0D not in buf:
            n = len(buf)
            if n > 1 and buf[-1] == 0x0A and buf[-2] == 0x0A and 0x0A not in buf[:-2]:
                return buf, [n]  # the usual read: one event of one line
            ends = _lf_ends(buf)
        else:
            ends = [m.end() for m in _EVENT_END.finditer(buf)]
        pos = ends[-1] if ends else 0
        if pos == len(buf):
            return buf, ends
        self._keep(buf[pos:])
        return buf[:pos], ends

    def _ends_event(self, data: bytes) -> bool:
        """Whether `data` completes the kept partial event: searched in `data` and the kept
        bytes' last few only, so a long event costs each of its bytes one search."""
        if 0x0A not in data and 0x0D not in data:
            return False
        return _EVENT_END.search(self._buf[-1][-_END_REACH:] + data) is not None

    def _keep(self, piece: bytes) -> None:
        if not piece:
            return
        self._buf.append(piece)
        self._size += len(piece)
        if self.max_event_bytes is not None and self._size > self.max_event_bytes:
            size, self._buf, self._size = self._size, [], 0
            raise EventTooLarge(f"an event of over {self.max_event_bytes} bytes ({size} so far) without its end")

    def _join(self, data: bytes) -> bytes:
        """`data` after what was kept from the last read; at the stream's start, without a BOM."""
        buf = b"".join((*self._buf, data)) if self._buf else data
        self._buf, self._size = [], 0
        if not self._started and buf:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._keep(buf)  # maybe the start of a BOM: wait for more
                return b""
            self._started = True
            if buf.startswith(_BOM):
                buf = buf[len(_BOM):]
        return buf

    def flush_raw(self) -> bytes:
        """At EOF: what is left of a last event, ended with a blank line (LF) so whoever it is
        passed on to dispatches it too; b"" if only line ends were left."""
        rest = b"".join(self._buf).rstrip(b"\r\n")
        self._buf, self._size = [], 0
        return rest + b"\n\n" if rest else b""

    def feed(self, data: bytes) -> list[SSEEvent]:
        buf, ends = self.frame(data)
        return _events(buf, ends)

    def flush(self) -> list[SSEEvent]:
        return events_of(self.flush_raw())


def events_of(block: bytes) -> list[SSEEvent]:
    """The event in one whole block (what `flush_raw` returns), parsed."""
    return _events(block, [len(block)])


def _lf_ends(buf: bytes) -> list[int]:
    """Where each event ends in an LF-only buffer: after each LF that follows an LF."""
    ends: list[int] = []
    last = len(buf) - 1
    i = buf.find(b"\n")
    while 0 <= i < last:
        if buf[i + 1] == 0x0A:
            ends.append(i + 2)
            i = buf.find(b"\n", i + 2)
        else:
            i = buf.find(b"\n", i + 1)
    return ends


def _events(buf: bytes, ends: list[int]) -> list[SSEEvent]:
    events: list[SSEEvent] = []
    start = 0
    for end in ends:
        ev = _parse_block(buf[start:end])
        if ev is not None:
            events.append(ev)
        start = end
    return events


def _parse_block(block: bytes) -> SSEEvent | None:
    data_lines: list[bytes] = []
    event: str | None = None
    id_: str | None = None
    lines = _LINE_END.split(block) if 0x0D in block else block.split(b"\n")
    for line in lines:
        if not line or line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data_lines.append(value)
        elif field == b"event":
            event = value.decode("utf-8", "replace")
        elif field == b"id" and b"\0" not in value:
            id_ = value.decode("utf-8", "replace")
    if not data_lines and event is None:
        return None
    return SSEEvent(data=b"\n".join(data_lines), event=event, raw=block, id=id_)


def is_done(buf: bytes, start: int, end: int) -> bool:
    """True if buf[start:end] is the `data: [DONE]` event that ends an OpenAI stream."""
    return end - start <= 24 and buf[start:end].strip() in _DONE_BLOCKS


def encode_event(data: bytes) -> bytes:
    """One `data:` event; `data` must not contain a blank line (JSON from orjson never does)."""
    return b"data: " + data + b"\n\n"
