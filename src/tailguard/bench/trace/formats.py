"""Reading a trace file: its format by name (`FORMATS`) or found from its first line (`sniff`),
and the requests in arrival order. The one module of the trace package that opens a file.

| format | file | found by |
|---|---|---|
| `azure` | CSV `TIMESTAMP,ContextTokens,GeneratedTokens` | the header's `ContextTokens` |
| `burstgpt` | CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` | `Request tokens` |
| `mooncake` | JSONL `{"timestamp", "input_length", "output_length", "hash_ids"}` | `input_length` |
| `tailguard` | the gateway's access log, or a bench run's requests.jsonl | `event`/`ts`, or `scheduled_at` |
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from tailguard.bench.trace.jsonl import MOONCAKE_BLOCK_TOKENS, read_mooncake, read_tailguard
from tailguard.bench.trace.request import Trace, TraceRequest, rebased
from tailguard.bench.trace.tables import read_azure, read_burstgpt
from tailguard.errors import TraceError

Reader = Callable[[Iterable[str], str], list[TraceRequest]]
FORMATS: dict[str, Reader] = {"azure": read_azure, "burstgpt": read_burstgpt, "mooncake": read_mooncake,
                              "tailguard": lambda lines, where: read_tailguard(lines, where)[0]}


def sniff(first_line: str, where: str) -> str:
    """The format a file's first non-empty line shows."""
    line = first_line.strip().lstrip("\ufeff")
    if line.startswith("{"):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            if "input_length" in obj:
                return "mooncake"
            if "scheduled_at" in obj or "event" in obj or "ts" in obj:
                return "tailguard"
    elif "ContextTokens" in line:
        return "azure"
    elif "Request tokens" in line:
        return "burstgpt"
    raise TraceError(f"{where}:1: not a trace format this bench knows from its first line ({line[:80]!r}); "
                     f"give --trace-format ({', '.join(FORMATS)})")


def read_trace(path: str | Path, fmt: str | None = None) -> Trace:
    """The trace at `path` in `fmt` (found from its first line when None), sorted by arrival and
    counted from its first request. `TraceError` names the file and line of anything unreadable."""
    where = str(path)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"--trace-format {fmt!r}: the formats are {', '.join(FORMATS)}")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except OSError as e:
        raise TraceError(f"{where}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = text.splitlines(keepends=True)
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise TraceError(f"{where}: the file is empty")
    fmt = fmt or sniff(first, where)
    notes: list[str] = []
    if fmt == "tailguard":
        requests, skipped = read_tailguard(lines, where)
        if skipped:
            notes.append(f"{skipped} line(s) of the log were not generation requests (other log lines, routes "
                         "that generate nothing): skipped")
    else:
        requests = FORMATS[fmt](lines, where)
    if not requests:
        raise TraceError(f"{where}: no requests in the file")
    return Trace(where, fmt, rebased(requests), MOONCAKE_BLOCK_TOKENS if fmt == "mooncake" else 0, tuple(notes))
