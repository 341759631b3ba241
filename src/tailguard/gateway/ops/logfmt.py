"""The gateway's own log lines (start, stop, what probes find, reloads): one JSON object a line,
with an RFC 3339 timestamp, a level and an event name, as the access lines are; or, with
`log_format: text`, the same fields on one line for a terminal.

A call names its event and fields with `extra={"event": "start", "fields": {...}}`; one that
names none is the event of the function that logged it (`_apply` -> `apply`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import orjson


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    ts = datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
    event = getattr(record, "event", None) or record.funcName.strip("_") or "log"
    out: dict[str, Any] = {"ts": ts, "level": record.levelname.lower(), "event": event,
                           "message": record.getMessage()}
    extra = getattr(record, "fields", None)
    if isinstance(extra, dict):
        out.update(extra)
    if record.exc_info:
        out["exception"] = logging.Formatter().formatException(record.exc_info)
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps(_fields(record), default=str).decode()


class TextFormatter(logging.Formatter):
    """`ts LEVEL event message key=value ...`: the same facts, read by a person."""

    def format(self, record: logging.LogRecord) -> str:
        f = _fields(record)
        head = f"{f.pop('ts')} {f.pop('level').upper()} {f.pop('event')} {f.pop('message')}"
        rest = " ".join(f"{k}={v}" for k, v in f.items())
        return f"{head} {rest}" if rest else head


FORMATTERS: dict[str, type[logging.Formatter]] = {"json": JsonFormatter, "text": TextFormatter}
