"""The JSON-lines traces: Mooncake's and tailguard's own (the gateway's access log, the bench's
requests.jsonl); pure (lines in, requests out).

- Mooncake (Qin et al., "Mooncake", FAST 2025; `mooncake_trace.jsonl` of kvcache-ai/Mooncake):
  `timestamp` (ms since the trace's start), `input_length`, `output_length`, `hash_ids` (one id
  per 512-token block of the prompt; requests that share a prefix share its ids). AIPerf's
  `mooncake_trace` loader (`aiperf/dataset/loader/mooncake_trace.py`) also reads a `session_id`;
  so does this one, and sends it as the session.
- The gateway's access log (one `{"event": "access", ...}` line per request, written as it
  ends): its arrival is `ts` less `e2e_ms`; its class, model, caller and route are kept. Other
  lines of the gateway's log, and access lines of routes that generate nothing (a 404), are
  skipped and counted.
- The bench's requests.jsonl: `scheduled_at`, the sizes it sent and what came back.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

from tailguard.bench.dataset import json_objects
from tailguard.bench.trace.request import Scalar, TraceRequest
from tailguard.errors import TraceError

MOONCAKE_BLOCK_TOKENS = 512  # the block size of Mooncake's hash_ids


def _number(obj: dict[str, Any], key: str, where: str, n: int) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        what = "missing" if key not in obj else f"{v!r}, not a number"
        raise TraceError(f"{where}:{n}: {key} is {what}")
    return float(v)


def _tokens(obj: dict[str, Any], key: str, where: str, n: int) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        what = "missing" if key not in obj else f"{v!r}, not a whole number of tokens >= 0"
        raise TraceError(f"{where}:{n}: {key} is {what}")
    return v


def _scalars(obj: dict[str, Any], leave: tuple[str, ...]) -> dict[str, Scalar]:
    return {k: v for k, v in obj.items() if k not in leave and (v is None or isinstance(v, (str, int, float, bool)))}


def read_mooncake(lines: Iterable[str], where: str) -> list[TraceRequest]:
    out = []
    for n, obj in json_objects(lines, where, "one JSON object", TraceError):
        at = _number(obj, "timestamp", where, n) / 1000.0
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TraceError(f"{where}:{n}: hash_ids is {ids!r}, not a list of integers")
        session = obj.get("session_id")
        if session is not None and not isinstance(session, (str, int)):
            raise TraceError(f"{where}:{n}: session_id is {session!r}, not a string")
        out.append(TraceRequest(at, _tokens(obj, "input_length", where, n), _tokens(obj, "output_length", where, n), n,
                                hash_ids=tuple(ids), session=None if session is None else str(session),
                                fields=_scalars(obj, ("timestamp", "hash_ids"))))
    return out


def _endpoint(path: object) -> str | None:
    if path == "/v1/completions":
        return "completions"
    return "chat" if path == "/v1/chat/completions" else None


def _access(obj: dict[str, Any], where: str, n: int) -> TraceRequest:
    ts = obj.get("ts")
    try:
        end = dt.datetime.fromisoformat(str(ts)).timestamp()
    except ValueError:
        raise TraceError(f"{where}:{n}: ts {ts!r} is not an RFC 3339 instant") from None
    cls = obj.get("class")
    return TraceRequest(end - _number(obj, "e2e_ms", where, n) / 1000.0, _tokens(obj, "prompt_tokens", where, n),
                        _tokens(obj, "output_tokens", where, n), n, cls=cls if isinstance(cls, str) else None,
                        class_header=cls if isinstance(cls, str) else None, endpoint=_endpoint(obj.get("path")),
                        fields=_scalars(obj, ("ts", "level", "event", "id", "request_id", "client", "user_agent")))


def _bench_record(obj: dict[str, Any], where: str, n: int) -> TraceRequest:
    prompt = obj.get("usage_prompt_tokens")
    if not isinstance(prompt, int) or isinstance(prompt, bool):
        prompt = _tokens(obj, "prompt_tokens", where, n)
    # What it generated, when it ended well; else what it asked for (it may have been cut short).
    output = _tokens(obj, "output_tokens" if obj.get("ok") else "max_tokens", where, n)
    cls, server = obj.get("cls"), obj.get("server_class")
    session = obj.get("session")
    return TraceRequest(_number(obj, "scheduled_at", where, n), prompt, output, n,
                        session=session if isinstance(session, str) else None,
                        cls=cls if isinstance(cls, str) else None,
                        class_header=server if isinstance(server, str) else None,
                        fields=_scalars(obj, ("chunk_at", "server_timing_s", "attribution", "error")))


def read_tailguard(lines: Iterable[str], where: str) -> tuple[list[TraceRequest], int]:
    """The requests of an access log or a requests.jsonl, and how many lines were not requests
    (the gateway's other log lines, access lines of routes that generate nothing)."""
    out, skipped = [], 0
    for n, obj in json_objects(lines, where, "one JSON object", TraceError):
        if "scheduled_at" in obj:
            out.append(_bench_record(obj, where, n))
        elif obj.get("event") == "access" and "prompt_tokens" in obj:
            out.append(_access(obj, where, n))
        elif "event" in obj or "ts" in obj:
            skipped += 1
        else:
            raise TraceError(f"{where}:{n}: neither an access-log line (event: access) nor a bench record "
                             "(scheduled_at)")
    return out, skipped


def recorded_latency(r: TraceRequest) -> tuple[float | None, float | None]:
    """(TTFT, E2E) in seconds as tailguard's own log recorded them (None where it did not: a
    public trace, a request that failed or never had content)."""
    f = r.fields
    if "e2e_ms" in f:  # the gateway's access log
        ttft, e2e = f.get("ttft_ms"), f.get("e2e_ms")
        ok = f.get("outcome") in (None, "success")
        return (ttft / 1000.0 if ok and isinstance(ttft, (int, float)) else None,
                e2e / 1000.0 if ok and isinstance(e2e, (int, float)) else None)
    due, first, end = f.get("scheduled_at"), f.get("first_token_at"), f.get("ended_at")
    if not isinstance(due, (int, float)) or not f.get("ok"):
        return None, None
    return (first - due if isinstance(first, (int, float)) else None,
            end - due if isinstance(end, (int, float)) else None)
