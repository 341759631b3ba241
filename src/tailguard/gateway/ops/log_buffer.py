"""The access log's default handler: lines gathered in memory and written in one call at most every
`flush_s` (or once `max_lines` wait), as nginx's `access_log ... buffer= flush=` does.

A `StreamHandler` writes and flushes once per request, on the event loop: one system call per
request, and a loop that stalls whenever stderr is a pipe its reader is slow to empty (a container
log driver, journald under load). Gathered, the cost is one write per interval, and a slow reader
delays only the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TextIO


class BufferedLineHandler(logging.Handler):
    """Formats each record to one line and writes the gathered lines together (see the module
    docstring). Without a running event loop (start-up, shutdown) it writes at once."""

    def __init__(self, stream: TextIO, *, flush_s: float = 0.2, max_lines: int = 512) -> None:
        super().__init__()
        self.stream = stream
        self.flush_s = flush_s
        self.max_lines = max_lines
        self._lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.add(line)

    def add(self, line: str) -> None:
        """Take one finished line. The access log calls this directly when this handler is the
        logger's only one: making a `LogRecord` per request (its time, thread, process and
        caller fields) would cost more than the line itself."""
        self._lines.append(line)
        if len(self._lines) >= self.max_lines:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._timer = loop.call_later(self.flush_s, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed: the log has nowhere to go, the gateway keeps serving

    def close(self) -> None:
        self.flush()
        super().close()
