"""The access log: one JSON line per request on logger `tailguard.access` (no prompt text unless
asked, through the redaction), and one for a request no generation route took, so every status
the gateway answers is in the log.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Callable

import orjson

from tailguard.front.intake import NO_CLASS
from tailguard.gateway.ops.log_buffer import BufferedLineHandler
from tailguard.gateway.request import Request
from tailguard.slo import judge

ACCESS_LOGGER = "tailguard.access"

_access_log = logging.getLogger(ACCESS_LOGGER)


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def access_log(t: Request, *, method: str, path: str, text: Callable[[str], str] | None = None) -> None:
    """One JSON line per request on logger `tailguard.access`; its prompt and completion text
    only with `text`, written through it (the lifecycle passes the redaction of `redaction:`, and
    only with `log_prompts: true`). The guards' verdicts other than pass, when there were any."""
    if not _access_log.isEnabledFor(logging.INFO):
        return
    end = t.finished_at if t.finished_at is not None else t.arrived_at
    # `outcome` goes in as it is: orjson writes an enum member as its value, without the lookup.
    rec: dict[str, Any] = {
        "ts": _now_rfc3339(), "level": "info", "event": "access",
        "id": t.id, "request_id": t.request_id, "method": method, "path": path, "status": t.status,
        "outcome": t.outcome, "class": None if t.cls == NO_CLASS else t.cls, "model": t.model,
        "backend": t.backend, "attempts": t.counts.attempts,
        "queue_ms": None if t.bound_at is None else round((t.bound_at - t.arrived_at) * 1000.0, 3),
        "ttft_ms": None if t.first_content_at is None else round((t.first_content_at - t.arrived_at) * 1000.0, 3),
        "e2e_ms": round((end - t.arrived_at) * 1000.0, 3),
        "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens, "preemptions": t.counts.preemptions,
        "client": t.client, "user_agent": t.user_agent,
    }
    _add_present(rec, t, end)
    if text is not None:
        if t.prompt_text is not None:
            rec["prompt"] = text(t.prompt_text)
        if t.completion is not None:
            rec["completion"] = text(t.completion)
    _write_access(rec)


def _add_present(rec: dict[str, Any], t: Request, end: float) -> None:
    """The fields most lines have no value for, only where they have one: a short line for the
    common request."""
    if t.reason is not None:
        rec["reason"] = t.reason
    counts = t.counts
    if counts.retries:
        rec["retries"] = counts.retries
    if counts.migrations:
        rec["migrations"] = counts.migrations
    if counts.hedges:
        rec["hedges"] = counts.hedges
    if t.caller is not None:
        rec["caller"] = t.caller
    if t.program is not None:  # its program by a digest (never the session or user id itself), and which call
        rec["program"], rec["program_call"], rec["program_source"] = t.program.id, t.program.call, t.program.source
    if t.slo is not None:  # each target: met or missed (`tailguard.slo`)
        rec["slo"] = judge(t.slo, t.outcome, end - t.arrived_at, t.ttft_s, t.output_tokens)
        if t.slo.ttft_s is not None:
            rec["ttft_slo_ms"] = round(t.slo.ttft_s * 1000.0, 3)
    if t.output_estimated:
        rec["output_tokens_estimated"] = True
    if t.overrun_tokens:
        rec["overrun_tokens"] = t.overrun_tokens
    if t.verdicts:
        rec["guards"] = t.verdicts


def route_access_log(*, request_id: str, method: str, path: str, status: int, reason: str | None,
                     client: str | None, user_agent: str | None) -> None:
    """The access line of a request no generation route took (a 404, a 405, a body too large
    for the route): so every status the gateway answers is in the log."""
    if _access_log.isEnabledFor(logging.INFO):
        _write_access({"ts": _now_rfc3339(), "level": "info", "event": "access", "request_id": request_id,
                       "method": method, "path": path, "status": status, "reason": reason, "client": client,
                       "user_agent": user_agent})


def _write_access(rec: dict[str, Any]) -> None:
    line = orjson.dumps(rec).decode()
    handlers = _access_log.handlers
    if len(handlers) == 1 and type(handlers[0]) is BufferedLineHandler and not _access_log.filters:
        handlers[0].add(line)  # the default handler (see `BufferedLineHandler.add`)
        return
    # The record made and handled directly: `Logger.info` would first walk the stack for the
    # caller's file and line (`findCaller`), which an access line never shows.
    _access_log.handle(_access_log.makeRecord(ACCESS_LOGGER, logging.INFO, "", 0, line, (), None))
