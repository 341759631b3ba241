"""Who may call the gateway at all, and the service tier an answer reports; pure, no I/O.

Which class a request is in, and what it may ask for, is the intake's (`tailguard.front.intake`),
which the simulated gateway shares; this table holds it for the running config.
"""

from __future__ import annotations

from tailguard.errors import APIError, BadRequest, Forbidden
from tailguard.front.intake import Intake, Refused
from tailguard.front.params import ClassSpec
from tailguard.config import GatewayConfig
from tailguard.config.auth import MAX_KEY_CHARS


class Unauthorized(APIError):
    status = 401
    type = "authentication_error"


def answer(refused: Refused) -> APIError:
    """The intake's refusal as its client gets it: a 403 when its key may not have what it asked
    for (OpenAI's `PermissionDeniedError`), else a 400."""
    kind = Forbidden if refused.forbidden else BadRequest
    return kind(refused.message, param=refused.param, code=refused.code)


class ClassTable:
    """The running config's intake, with the gateway's own checks around it.

        table = ClassTable(cfg)
        table.authenticate(api_key)                      # 401 unless auth is off or the key is listed
        cls = table.intake.classify(asked)
    """

    def __init__(self, cfg: GatewayConfig) -> None:
        self.intake = Intake(cfg.intake_params())
        self.auth_required: bool = bool(cfg.auth.api_keys)
        self.admin: frozenset[str] = cfg.auth.admin_digests()  # the admin keys' digests (`gateway.http.admin`)

    def served_tier(self, requested: object, cls: ClassSpec) -> str | None:
        """The `service_tier` a response reports when the request named one: the tier asked for
        when that is the class it was served in, else the tier of that class (`flex` for the
        class `flex` maps to, `default` for the others). None when the request named none, so a
        response is left as the engine wrote it."""
        if not isinstance(requested, str):
            return None
        if requested != "auto" and self.intake.tier_class(requested) is cls:
            return requested
        return "flex" if self.intake.tier_class("flex") is cls else "default"

    def authenticate(self, api_key: str | None) -> None:
        """Raise a 401 when keys are configured and this one is missing or unknown."""
        if not self.auth_required:
            return
        if api_key is None:
            raise Unauthorized(
                "This gateway requires an API key: send 'Authorization: Bearer <key>'.", code="missing_api_key"
            )
        if len(api_key) > MAX_KEY_CHARS or self.intake.key(api_key) is None:
            raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")
