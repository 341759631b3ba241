"""Fields the gateway adds to a request body on its own (vLLM's `priority`, the running usage in
`stream_options`, `return_token_ids`) that a backend turned out to refuse; pure, no I/O.

Engine truths are found, not assumed: a vLLM started without `--scheduling-policy priority`
(and the simulator, which copies it) answers `400 "... Priority scheduling is not enabled."` to a
request whose `priority` is not 0, so every batch request would fail. The exchange hands such a
400 to `refused_field`; when it names a field the gateway added, the request goes again once
without it, and `Refusals` remembers the field for that backend so it is never sent there again
(shown in `/health`, logged once). A field the client sent itself is never dropped this way: its
refusal is the client's answer. LiteLLM does the same for OpenAI parameters a provider does not
take (`drop_params`), by a static list; here the backend's own answer decides.

    field = refused_field(400, body, added_fields(kind, count_tokens=False))  # -> "priority"
    if field is not None and refusals.learn("gpu-a", field): log once
    refusals.dropped("gpu-a")                                                  # -> {"priority"}
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tailguard.gateway.upstream.kinds import Kind
from tailguard.wire.openai import error_fields

# How engines word a refusal of a field they do not take: vLLM's "Priority scheduling is not
# enabled", pydantic's "Extra inputs are not permitted", "unsupported", "unknown field", ...
_REFUSING = re.compile(r"not enabled|not supported|unsupported|not permitted|unrecognized|unknown|not allowed")


def added_fields(kind: Kind, *, count_tokens: bool) -> tuple[str, ...]:
    """The body fields a backend of `kind` gets from the gateway rather than from the client."""
    out = [] if kind.priority_field is None else [kind.priority_field]
    if count_tokens and not kind.one_token_per_chunk:
        out += kind.running_usage_options
    if count_tokens and kind.continues_by_ids:
        out.append("return_token_ids")
    return tuple(out)


def refused_field(status: int, payload: bytes, added: Iterable[str]) -> str | None:
    """The added field a 400 answer refuses (its `param`, or its message naming the field with
    refusing words), or None when the refusal is about something else."""
    if status != 400:
        return None
    fields, err = error_fields(payload)
    message = fields.get("message") or fields.get("detail") or (err if isinstance(err, str) else "")
    text = (message if isinstance(message, str) else str(message)).lower()
    param = fields.get("param")
    refusing = _REFUSING.search(text) is not None
    for name in added:
        if refusing and (param == name or re.search(rf"\b{re.escape(name)}\b", text)):
            return name
    return None


class Refusals:
    """The added fields each backend refused, learned from its answers, for as long as the
    gateway runs (a restarted engine with priority scheduling is seen after a gateway restart)."""

    def __init__(self) -> None:
        self._dropped: dict[str, frozenset[str]] = {}

    def dropped(self, backend: str) -> frozenset[str]:
        return self._dropped.get(backend, frozenset())

    def learn(self, backend: str, field: str) -> bool:
        """Remember that `backend` refuses `field`; True the first time (the caller logs it)."""
        known = self.dropped(backend)
        if field in known:
            return False
        self._dropped[backend] = known | {field}
        return True
