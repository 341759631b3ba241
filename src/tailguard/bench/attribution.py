"""Where each request's time went: its E2E split into dispatch lag, gateway queue, engine queue,
prefill, decode and stalls, from what the bench recorded (pure, no I/O).

The parts add up to the E2E exactly (scheduled send to last byte):

- `dispatch_s`: scheduled to actually sent (the generator's lateness).
- `gateway_queue_s`: the gateway's own queue (`Server-Timing: queue`, else `X-Tailguard-Queue-Ms`).
- `engine_queue_s` and `prefill_s`: the rest of the time to the first token. Over HTTP an engine
  does not say, per request, how long it waited; so the request's prefill is taken as the fastest
  time to first token seen in the run for a prompt of its size (its "floor"), and anything above
  that is waiting: for a slot, or behind other requests' prefill in the same steps.
- `stall_s`: the part of every gap between content chunks above `STALL_FACTOR` times the
  request's own median gap (a preemption, a KV swap, a starved step), so decode keeps only the
  request's steady pace.
- `decode_s`: first token to last byte, less the stalls. A non-stream reply has no first token
  before its end: its time after the gateway queue is all in `decode_s`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import median

from tailguard.bench.recorder import RequestRecord

PARTS: tuple[str, ...] = ("dispatch_s", "gateway_queue_s", "engine_queue_s", "prefill_s", "decode_s", "stall_s")
# A gap five times the request's own median ITL is far outside a steady decode: vLLM's decode
# steps vary by tens of percent with batch size, never by 5x without a preemption or a stall.
STALL_FACTOR = 5.0
TAIL_FRACTION = 0.01  # "the slowest 1%" of a class


def size_bucket(prompt_tokens: int) -> int:
    """Prompts within a factor of two share a prefill floor."""
    return int(math.log2(max(1, prompt_tokens)))


def _gateway_queue_s(rec: RequestRecord) -> float:
    st = rec.server_timing_s or {}
    if "queue" in st:
        return st["queue"]
    return rec.queue_ms / 1000.0 if rec.queue_ms is not None else 0.0


def _to_first_s(rec: RequestRecord) -> float | None:
    """Sent to first token, less the gateway queue: the engine's queue plus prefill."""
    if rec.first_token_at is None or not rec.stream:
        return None
    return max(0.0, rec.first_token_at - rec.sent_at - _gateway_queue_s(rec))


def prefill_floors(records: Iterable[RequestRecord]) -> dict[int, float]:
    """Per prompt-size bucket, the fastest sent-to-first-token time of a successful stream; a
    bucket's floor is never below a smaller bucket's (a longer prompt never prefills faster)."""
    floors: dict[int, float] = {}
    for r in records:
        t = _to_first_s(r)
        if t is not None and r.ok:
            b = size_bucket(r.prompt_tokens)
            floors[b] = min(t, floors.get(b, math.inf))
    best = 0.0
    for b in sorted(floors):
        best = floors[b] = max(best, floors[b])
    return floors


def _floor_for(floors: dict[int, float], prompt_tokens: int) -> float:
    b = size_bucket(prompt_tokens)
    if b in floors:
        return floors[b]
    below = [floors[k] for k in floors if k < b]
    return max(below) if below else 0.0


def stall_s(chunk_at: Sequence[float]) -> float:
    """Time in gaps beyond `STALL_FACTOR` times the stream's median gap."""
    if len(chunk_at) < 3:
        return 0.0
    gaps = [b - a for a, b in zip(chunk_at, chunk_at[1:])]
    limit = STALL_FACTOR * median(gaps)
    return sum(g - limit for g in gaps if g > limit)


def attribute(rec: RequestRecord, floors: dict[int, float]) -> dict[str, float]:
    """The request's E2E in `PARTS`; each part >= 0, the sum equals `rec.e2e_s` (clamped at 0)."""
    end = max(rec.ended_at, rec.scheduled_at)
    sent = min(max(rec.sent_at, rec.scheduled_at), end)
    first = end if rec.first_token_at is None else min(max(rec.first_token_at, sent), end)
    gw = min(_gateway_queue_s(rec), first - sent)
    before_first = first - sent - gw
    out = dict.fromkeys(PARTS, 0.0)
    out["dispatch_s"] = sent - rec.scheduled_at
    out["gateway_queue_s"] = gw
    if rec.stream and rec.first_token_at is not None:
        prefill = min(before_first, _floor_for(floors, rec.prompt_tokens))
        out["prefill_s"] = prefill
        out["engine_queue_s"] = before_first - prefill
        stalls = min(stall_s(rec.chunk_at), end - first)
        out["stall_s"] = stalls
        out["decode_s"] = end - first - stalls
    elif rec.stream:  # never saw a token: it waited until it failed
        out["engine_queue_s"] = before_first
    else:
        out["decode_s"] = before_first
    return {k: round(v, 6) for k, v in out.items()}


def attribute_all(records: Sequence[RequestRecord]) -> None:
    """Fill `attribution` on every record, with the floors of this run's measured requests."""
    floors = prefill_floors(r for r in records if not r.warmup)
    for r in records:
        r.attribution = attribute(r, floors)


def slowest(records: Sequence[RequestRecord], fraction: float = TAIL_FRACTION) -> list[RequestRecord]:
    """The slowest `fraction` by E2E (at least one), slowest first."""
    ranked = sorted(records, key=lambda r: r.e2e_s, reverse=True)
    return ranked[:max(1, math.ceil(len(ranked) * fraction))] if ranked else []


def mean_parts(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Mean seconds per part over `records` (which carry an attribution)."""
    if not records:
        return dict.fromkeys(PARTS, 0.0)
    return {p: sum((r.attribution or {}).get(p, 0.0) for r in records) / len(records) for p in PARTS}


def tail_parts(records: Sequence[RequestRecord], fraction: float = TAIL_FRACTION) -> dict[str, dict[str, float]]:
    """Per class, the mean parts of its slowest `fraction`: the report's stacked bars."""
    out: dict[str, dict[str, float]] = {}
    for cls in sorted({r.cls for r in records}):
        out[cls] = mean_parts(slowest([r for r in records if r.cls == cls], fraction))
    return out
