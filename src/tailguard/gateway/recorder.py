"""`tailguard serve --record FILE`: the front's events, its decisions and each request's ending,
written as JSON lines (the format is `tailguard.front.recording`'s) for `tailguard replay`.

The dispatcher hands over every event it gave the front, with the `now` it told it and the
decisions that came back; the proxy hands over each request as it ends. Lines are gathered and
written together every 0.2 s by the access log's own buffer (`BufferedLineHandler`), and at once
when 4096 wait, so the buffer is bounded and a slow disk delays only the recording. When the
gateway does not record, all of this costs one `is None` check per event and per request.

`Generated` comes once per content chunk of a preemptible request, and the front decides nothing
on it: it only keeps the latest count, which it reads when it weighs a preemption, and a
preemption can come only from another event. So only the latest `Generated` of each request is
kept, and written just before the next other event: the front replaying the file holds the same
counts at every moment it can decide anything.

Clocks: the front is told `loop.time()`; a request's instants (`RequestTimes`) are
`time.perf_counter()`. Both are CLOCK_MONOTONIC on Linux, but uvloop's `loop.time()` is the
loop's cached millisecond time, so the offset between them is measured once at start and added to
every request instant: the `request` lines are on the front's clock, within a millisecond.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from tailguard.front.events import Decision, Event, Generated
from tailguard.front.params import FrontParams
from tailguard.front.recording import Header, Observation, header_line, request_line, step_line
from tailguard.gateway.log_buffer import BufferedLineHandler
from tailguard.gateway.metrics import RequestTimes
from tailguard.types import Outcome

FLUSH_S = 0.2
MAX_LINES = 4096


class Recorder:
    """Writes one recording to `stream`, starting with `header`; `close` flushes and closes it.
    `offset_s` turns a request's `perf_counter` instants into the front's clock."""

    def __init__(self, stream: TextIO, header: Header, offset_s: float) -> None:
        self._stream = stream
        self._out = BufferedLineHandler(stream, flush_s=FLUSH_S, max_lines=MAX_LINES)
        self._offset_s = offset_s
        # The latest Generated of each request since the last other event: (event, now, preempt).
        self._generated: dict[str, tuple[Generated, float, bool]] = {}
        self._closed = False
        self._write(header_line(header))
        self._out.flush()

    @classmethod
    def open(cls, path: Path, params: FrontParams, loop: asyncio.AbstractEventLoop, *,
             config_hash: str | None = None, settings: Mapping[str, Any] | None = None) -> Recorder:
        """Start recording to `path` (replaced if it exists) a front built from `params`."""
        offset_s = loop.time() - time.perf_counter()
        clock = {"now": "the gateway's loop.time()", "requests": "time.perf_counter() + offset_s", "offset_s": offset_s}
        return cls(open(path, "w", encoding="utf-8"), Header(params, config_hash, settings, clock), offset_s)

    def event(self, event: Event, now: float, preempt: bool, decisions: Sequence[Decision]) -> None:
        """The front was handed `event` at `now` and decided `decisions`."""
        if type(event) is Generated and not decisions:
            pending = self._generated
            pending.pop(event.id, None)  # re-inserted last: pending counts stay in time order
            pending[event.id] = (event, now, preempt)
            return
        if self._generated:
            self._write_generated()
        self._write(step_line(event, now, preempt, decisions))

    def request(self, req_id: str, t: RequestTimes, outcome: Outcome) -> None:
        """Request `req_id` ended with `outcome`; `t` holds its sizes and instants."""
        off = self._offset_s
        self._write(request_line(Observation(
            req_id, t.cls, outcome, t.prompt_tokens, t.output_tokens, t.arrived_at + off,
            (t.finished_at if t.finished_at is not None else t.arrived_at) + off,
            None if t.bound_at is None else t.bound_at + off,
            None if t.first_content_at is None else t.first_content_at + off,
            None if t.backend == "-" else t.backend, t.caller, t.attempts, t.preemptions)))

    def close(self) -> None:
        """Write what is pending and close the file; what comes later is dropped."""
        if self._closed:
            return
        self._write_generated()
        self._closed = True
        self._out.close()
        self._stream.close()

    def _write_generated(self) -> None:
        pending, self._generated = self._generated, {}
        for event, now, preempt in pending.values():
            self._write(step_line(event, now, preempt, ()))

    def _write(self, line: dict[str, Any]) -> None:
        if not self._closed:
            self._out.add(orjson.dumps(line).decode())
