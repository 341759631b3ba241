"""The CSV traces: Azure's LLM inference traces and BurstGPT; pure (lines in, requests out).

- Azure (Patel et al., "Splitwise", ISCA 2024; the Azure Public Dataset's
  `AzureLLMInferenceTrace_{conv,code}.csv`): `TIMESTAMP` (the invocation's wall-clock instant,
  `2023-11-16 18:15:46.6805900`), `ContextTokens`, `GeneratedTokens`.
- BurstGPT (Wang et al., 2024): `Timestamp` (seconds since the trace's start), `Model`,
  `Request tokens`, `Response tokens`, `Total tokens`, `Log Type`. AIPerf's reader
  (`aiperf/dataset/loader/burst_gpt.py`) skips a row it cannot read; here it is an error that
  names the line, since a replay that silently drops requests is not the trace's load.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Iterable, Sequence

from tailguard.bench.trace.request import Scalar, TraceRequest
from tailguard.errors import TraceError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def _rows(lines: Iterable[str], where: str, needed: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    """(line number, row by column name) for each data line; the header must name `needed`."""
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError(f"{where}: the file is empty") from None
    header = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in needed if c not in header]
    if missing:
        raise TraceError(f"{where}:1: the header has no column {', '.join(repr(c) for c in missing)} "
                         f"(it has {', '.join(header)})")
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            n = reader.line_num
            if len(row) != len(header):
                raise TraceError(f"{where}:{n}: {len(row)} columns, the header has {len(header)}")
            yield n, {h: c.strip() for h, c in zip(header, row)}
    except csv.Error as e:
        raise TraceError(f"{where}:{reader.line_num}: not CSV: {e}") from None


def count(value: str, column: str, where: str, n: int) -> int:
    """A token count: a whole number >= 0."""
    try:
        v = float(value)
    except ValueError:
        raise TraceError(f"{where}:{n}: {column} {value!r} is not a number") from None
    if v < 0 or v != int(v):
        raise TraceError(f"{where}:{n}: {column} {value!r} is not a whole number of tokens >= 0")
    return int(v)


def _instant(value: str, where: str, n: int) -> float:
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise TraceError(f"{where}:{n}: TIMESTAMP {value!r} is not a date and time "
                         "(like 2023-11-16 18:15:46.6805900)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def read_azure(lines: Iterable[str], where: str) -> list[TraceRequest]:
    out = []
    for n, row in _rows(lines, where, AZURE_COLUMNS):
        fields: dict[str, Scalar] = {k: v for k, v in row.items() if k != "TIMESTAMP"}
        out.append(TraceRequest(_instant(row["TIMESTAMP"], where, n), count(row["ContextTokens"], "ContextTokens", where, n),
                                count(row["GeneratedTokens"], "GeneratedTokens", where, n), n, fields=fields))
    return out


def read_burstgpt(lines: Iterable[str], where: str) -> list[TraceRequest]:
    out = []
    for n, row in _rows(lines, where, BURSTGPT_COLUMNS):
        try:
            at = float(row["Timestamp"])
        except ValueError:
            at = math.nan
        if not math.isfinite(at):
            raise TraceError(f"{where}:{n}: Timestamp {row['Timestamp']!r} is not a number of seconds")
        fields: dict[str, Scalar] = {k: v for k, v in row.items() if k != "Timestamp"}
        out.append(TraceRequest(at, count(row["Request tokens"], "Request tokens", where, n),
                                count(row["Response tokens"], "Response tokens", where, n), n,
                                fields=fields))
    return out
