"""The config the gateway runs now, as one object that a live reload replaces.

Each part reads what it needs from it when it starts something, not at the gateway's start: a
request takes its deadlines when it is dispatched, a probe its path, timeout and interval when it
is sent, `/v1/models` its refresh interval when it refetches. So a reload reaches every new
request and probe, and whatever is in flight keeps what it started with."""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.config import GatewayConfig


@dataclass(slots=True)
class Live:
    """The running config and its hash (sent on every response as `X-Tailguard-Config` and shown
    by `/health`), and its number in the state directory, when there is one."""

    cfg: GatewayConfig
    hash: str
    n: int | None = None

    @classmethod
    def of(cls, cfg: GatewayConfig) -> Live:
        return cls(cfg, cfg.digest())
