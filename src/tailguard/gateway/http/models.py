"""What `/v1/models` says the gateway serves: every model of the fleet once, and each alias.

Built from what the probes already read (each backend's own `/v1/models` entries, as it gave
them: vLLM's `max_model_len`, `root` and the rest pass through), the models a config names, and
the aliases, so answering it costs no upstream call and says what routing will do: a model listed
here reaches a backend that serves it, and one not listed gets a 404 (`model_not_found`) once
every backend's models are known. A key that may use only some models (`allowed_models`) sees only
those, and a 404 for the others, as OpenAI answers a model an organisation cannot access.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from tailguard.errors import NotFound
from tailguard.config import GatewayConfig
from tailguard.gateway.upstream.probes import served_models


def fleet_models(cfg: GatewayConfig, listed: Mapping[str, list[dict[str, Any]]],
                 allowed: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The model objects of the whole fleet, each id once, then the aliases; only those in
    `allowed` when a key's models are limited (the names its requests may use)."""
    seen: dict[str, dict[str, Any]] = {}
    for b in cfg.backends:
        entries = {m["id"]: m for m in listed.get(b.name, ())}
        for mid in served_models(b, listed.get(b.name)):
            if mid not in seen:
                seen[mid] = entries.get(mid) or {"id": mid, "object": "model", "owned_by": b.name}
    for alias, target in cfg.aliases.items():
        if alias not in seen:
            seen[alias] = {"id": alias, "object": "model", "owned_by": "tailguard", "root": target}
    return [m for m in seen.values() if allowed is None or m["id"] in allowed]


def one_model(models: list[dict[str, Any]], model_id: str) -> dict[str, Any]:
    """The model object of `model_id`, or OpenAI's 404."""
    for m in models:
        if m["id"] == model_id:
            return m
    served = ", ".join(m["id"] for m in models) or "none known yet"
    raise NotFound(f"The model `{model_id}` does not exist: no backend of this gateway serves it. Served here: "
                   f"{served}.", param="model", code="model_not_found")
