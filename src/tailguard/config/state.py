"""The gateway's config section for state shared between replicas (`state:`): where Redis is,
what a replica does while it cannot reach it, and how long a replica's presence lasts unrenewed.
Unset (`url: null`), every limit is the replica's own, as with one gateway."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from tailguard.config.base import _Model, fingerprint, require_extra


class StateConfig(_Model):
    """Replicas sharing per-key limits through Redis (docs/scale-out.md)."""

    url: str | None = Field(
        default=None,
        description="Redis URL, e.g. `redis://127.0.0.1:6379/0` (`rediss://` for TLS; a password in the URL is "
        "shown fingerprinted). Set: every caller's `rpm_limit`, `tpm_limit` and `max_parallel_requests`, and "
        "every backend's `max_concurrency`, is one limit over all the replicas using this Redis, and "
        "`/admin/usage` answers for all of them. Unset: each gateway enforces its limits alone.",
    )
    on_unavailable: Literal["local", "closed"] = Field(
        default="local",
        description="While Redis cannot be reached: `local` (each replica enforces its share, 1/N, of every "
        "caller's limits, N from `replicas` or the replicas last seen in Redis) or `closed` (requests of callers "
        "with limits get a 503 `shared_state_unavailable`). Back to shared limits when Redis answers again.",
    )
    replicas: int | None = Field(
        default=None, ge=1,
        description="How many replicas share the limits, for the `local` share. Unset: the number of replicas "
        "whose heartbeat Redis held when it was last reached (1 before it ever was).",
    )
    lease_s: float = Field(
        default=5.0, gt=0, le=300,
        description="How long a replica's heartbeat, its slot leases and its callers' places in flight last "
        "unrenewed; they are renewed three times a lease, and a replica that died stops being counted, and its "
        "slots and places come back, after this long.",
    )
    timeout_s: float = Field(
        default=1.0, gt=0, le=10,
        description="Longest wait for one Redis round trip (connect or answer) before Redis counts as unavailable.",
    )

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None and urlsplit(v).scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        if v is not None:
            require_extra("redis")
        return v

    def shown_url(self) -> str | None:
        """The URL as settings and logs show it: its password fingerprinted (a changed one shows)."""
        if self.url is None:
            return None
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        user = parts.username or ""
        return parts._replace(netloc=f"{user}:{fingerprint(parts.password)}@{host}{port}").geturl()
