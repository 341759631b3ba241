"""The access log's buffered handler: lines leave together, on a timer or when enough wait, and
at once when no event loop runs."""

from __future__ import annotations

import asyncio
import io
import logging

from tailguard.gateway.ops.log_buffer import BufferedLineHandler


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("tailguard.access", logging.INFO, "", 0, msg, (), None)


class _Counting(io.StringIO):
    writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


async def test_lines_are_gathered_and_written_together_after_the_interval() -> None:
    out = _Counting()
    h = BufferedLineHandler(out, flush_s=0.05)
    for i in range(3):
        h.emit(_record(f"line {i}"))
    assert out.getvalue() == ""  # nothing written yet: the loop is not blocked per request
    await asyncio.sleep(0.1)
    assert out.getvalue() == "line 0\nline 1\nline 2\n" and out.writes == 1


async def test_a_full_buffer_is_written_at_once_and_close_writes_the_rest() -> None:
    out = _Counting()
    h = BufferedLineHandler(out, flush_s=60, max_lines=2)
    for i in range(3):
        h.emit(_record(f"l{i}"))
    assert out.getvalue() == "l0\nl1\n"
    h.close()
    assert out.getvalue() == "l0\nl1\nl2\n"


def test_without_a_loop_each_line_is_written_at_once() -> None:
    out = io.StringIO()
    h = BufferedLineHandler(out)
    h.emit(_record("now"))
    assert out.getvalue() == "now\n"


def test_a_closed_stream_costs_the_log_not_the_caller() -> None:
    out = io.StringIO()
    out.close()
    BufferedLineHandler(out).emit(_record("lost"))  # raises nothing
