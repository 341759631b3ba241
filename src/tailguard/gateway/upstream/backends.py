"""How each kind of server wants its request body; pure, no I/O."""

from __future__ import annotations

from typing import Any

from tailguard.config import BackendConfig
from tailguard.gateway.upstream.kinds import get_kind

Body = dict[str, Any]


def resolved(backend: BackendConfig) -> BackendConfig:
    """The backend as requests are sent to it before its kind is known: `auto` acts as `openai`
    (no engine-specific fields, no suspension) until the gateway has asked the server."""
    return backend.model_copy(update={"kind": "openai"}) if backend.kind == "auto" else backend


def translate_body(kind: str, body: Body, rank: int, dropped: frozenset[str] = frozenset(),
                   own_priority: bool = False) -> Body | None:
    """The body a backend of `kind` should get for a request of class rank `rank`, or None when
    the body goes unchanged (so the caller forwards the bytes it has).

    Engines with a priority queue of their own (vLLM under `--scheduling-policy priority`,
    SGLang with priority scheduling) get the class as their `priority` field, in their own
    direction (`Kind.priority_for`). A client's own value is replaced: the class is the gateway's
    to set, or a batch client could jump the engine's queue with `priority: -100` (the intake
    drops it for every other kind). A body that already says what the class says (absent = the
    engine's default 0) is not rewritten. A key that may set it (`own_priority`) keeps its value.

    A field the backend refused (`dropped`, `gateway.upstream.refusals`) is not sent at all,
    the client's own value included: that engine has no priority queue to place it in."""
    placed = get_kind(kind).priority_for(rank)
    if placed is None:
        return None
    if placed[0] in dropped:
        return {k: v for k, v in body.items() if k != placed[0]} if placed[0] in body else None
    if own_priority and placed[0] in body:
        return None
    field, value = placed
    if body.get(field, 0) == value:
        return None
    new = dict(body)
    new[field] = value
    return new


def prepare_body(backend: BackendConfig, body: Body, rank: int, dropped: frozenset[str] = frozenset(),
                 own_priority: bool = False) -> Body | None:
    """`translate_body` plus the backend's `model` rewrite; None when nothing changes."""
    out = translate_body(resolved(backend).kind, body, rank, dropped, own_priority)
    if backend.model is not None and body.get("model") != backend.model:
        out = dict(out if out is not None else body)
        out["model"] = backend.model
    return out
