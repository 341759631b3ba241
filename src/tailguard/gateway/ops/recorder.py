"""`tailguard serve --record FILE`: the front's events, its decisions and each request's ending,
written as JSON lines (the format is `tailguard.recording.codec`'s) for `tailguard replay`.

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

Clock: the front's `now` and a request's instants (its record, `gateway.request.Request`) are the
gateway's one clock, so the file's times need no conversion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from tailguard.front.events import Decision, Event, Generated
from tailguard.front.params import FrontParams
from tailguard.recording.codec import Header, Observation, header_line, request_line, step_line
from tailguard.gateway.ops.log_buffer import BufferedLineHandler
from tailguard.gateway.request import Ended, Request

FLUSH_S = 0.2
MAX_LINES = 4096


class Recorder:
    """Writes one recording to `stream`, starting with `header`; `close` flushes and closes it."""

    def __init__(self, stream: TextIO, header: Header) -> None:
        self._stream = stream
        self._out = BufferedLineHandler(stream, flush_s=FLUSH_S, max_lines=MAX_LINES)
        # The latest Generated of each request since the last other event: (event, now, preempt).
        self._generated: dict[str, tuple[Generated, float, bool]] = {}
        self._closed = False
        self._write(header_line(header))
        self._out.flush()

    @classmethod
    def open(cls, path: Path, params: FrontParams, *,
             config_hash: str | None = None, settings: Mapping[str, Any] | None = None) -> Recorder:
        """Start recording to `path` (replaced if it exists) a front built from `params`."""
        clock = {"now": "the gateway's one clock (perf_counter seconds)", "requests": "the same clock"}
        return cls(open(path, "w", encoding="utf-8"), Header(params, config_hash, settings, clock))

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

    def ended(self, e: Ended) -> None:
        """A request's one end (`gateway.lifecycle`): its line in the recording."""
        self.request(e.request)

    def request(self, t: Request) -> None:
        """A request ended: its sizes, instants and outcome, from its record."""
        c = t.counts
        self._write(request_line(Observation(
            t.id, t.cls, t.outcome, t.prompt_tokens, t.output_tokens, t.arrived_at,
            t.finished_at if t.finished_at is not None else t.arrived_at, t.bound_at, t.first_content_at,
            None if t.backend == "-" else t.backend, t.caller, c.attempts, c.preemptions, c.retries, c.retries_denied,
            c.migrations, c.hedges, c.hedges_won)))

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
