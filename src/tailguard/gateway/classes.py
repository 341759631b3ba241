"""Which class a request belongs to, and who may call at all; pure, no I/O.

Order of precedence: the `X-Tailguard-Class` header, then OpenAI's `service_tier`, then the
caller's API key default, then `default_class`. A name the client states explicitly and the
gateway does not know is a 400 (a silent fallback would hide a client bug behind slow answers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tailguard.errors import APIError, BadRequest
from tailguard.gateway.config import ClassConfig, GatewayConfig

CLASS_HEADER = "X-Tailguard-Class"
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")


class Unauthorized(APIError):
    status = 401
    type = "authentication_error"


class ClassTable:
    """The configured classes, looked up by name, with the classification rules.

        table = ClassTable(cfg)
        table.authenticate(api_key)                      # 401 unless auth is off or the key is listed
        cls = table.classify(request.headers, body, api_key)
    """

    def __init__(self, cfg: GatewayConfig) -> None:
        self._by_name: dict[str, ClassConfig] = {c.name: c for c in cfg.classes}
        # Stable order: by rank, then as configured, so "the lowest rank" is well defined.
        self.ordered: tuple[ClassConfig, ...] = tuple(sorted(cfg.classes, key=lambda c: c.rank))
        self.default: ClassConfig = self._by_name[cfg.default_class]
        self._tiers: dict[str, ClassConfig | None] = self._tier_map(cfg)
        self._key_defaults: dict[str, ClassConfig | None] = {
            key: (self._by_name[k.default_class] if k.default_class is not None else None)
            for key, k in cfg.auth.api_keys.items()
        }
        self._callers: dict[str, str] = {key: k.caller(key) for key, k in cfg.auth.api_keys.items()}
        self.auth_required: bool = bool(cfg.auth.api_keys)
        self._known = ", ".join(c.name for c in self.ordered)

    def _tier_map(self, cfg: GatewayConfig) -> dict[str, ClassConfig | None]:
        first, last = self.ordered[0], self.ordered[-1]
        interactive = self._by_name.get("interactive")
        tiers: dict[str, ClassConfig | None] = {
            "priority": interactive or first,
            "scale": interactive or first,
            "default": interactive or self.default,
            "flex": self._by_name.get("batch") or last,
            "auto": None,
        }
        for tier, name in cfg.service_tier_map.items():
            tiers[tier] = self._by_name[name]
        return tiers

    def __getitem__(self, name: str) -> ClassConfig:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[ClassConfig]:
        return iter(self.ordered)

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> ClassConfig | None:
        return self._by_name.get(name)

    def served_tier(self, requested: object, cls: ClassConfig) -> str | None:
        """The `service_tier` a response reports when the request named one: the tier asked for
        when that is the class it was served in, else the tier of that class (`flex` for the
        class `flex` maps to, `default` for the others). None when the request named none, so a
        response is left as the engine wrote it."""
        if not isinstance(requested, str):
            return None
        if requested != "auto" and self._tiers.get(requested) is cls:
            return requested
        return "flex" if self._tiers["flex"] is cls else "default"

    def authenticate(self, api_key: str | None) -> None:
        """Raise a 401 when keys are configured and this one is missing or unknown."""
        if not self.auth_required:
            return
        if api_key is None:
            raise Unauthorized(
                "This gateway requires an API key: send 'Authorization: Bearer <key>'.", code="missing_api_key"
            )
        if api_key not in self._key_defaults:
            raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")

    def caller(self, api_key: str | None) -> str | None:
        """Whose request it is: its key's name (metering, limits); None when keys are off."""
        return self._callers.get(api_key) if api_key is not None else None

    def classify(self, headers: Mapping[str, str], body: Mapping[str, Any], api_key: str | None) -> ClassConfig:
        """The request's class; raises `BadRequest` for an unknown header class or service tier."""
        named = headers.get(CLASS_HEADER)
        if named is None:
            named = headers.get(CLASS_HEADER.lower())
        if named is not None:
            cls = self._by_name.get(named.strip())
            if cls is None:
                shown = named.strip()
                if len(shown) > 64:  # a header may hold 8 KB: the error names it, not echoes it
                    shown = shown[:64] + "..."
                raise BadRequest(
                    f"Unknown request class {shown!r} in header {CLASS_HEADER}; known classes: {self._known}.",
                    param=CLASS_HEADER, code="unknown_class",
                )
            return cls
        tier = body.get("service_tier")
        if tier is not None:
            if not isinstance(tier, str) or tier not in self._tiers:
                raise BadRequest(
                    f"'service_tier' must be one of {', '.join(SERVICE_TIERS)}; got {tier!r}.",
                    param="service_tier", code="invalid_value",
                )
            by_tier = self._tiers[tier]
            if by_tier is not None:
                return by_tier
        if api_key is not None:
            by_key = self._key_defaults.get(api_key)
            if by_key is not None:
                return by_key
        return self.default
