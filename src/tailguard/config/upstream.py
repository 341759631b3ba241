"""The sections of the gateway's config on what it does when an upstream is slow or fails:
`TimeoutsConfig` (deadlines per phase), `HealthConfig` (active probes) and `RetryConfig`
(retries that lose nothing). Kept together, apart from the backends themselves (backends.py),
because they apply to every backend alike."""

from __future__ import annotations

from pydantic import Field, field_validator

from tailguard.front import params as fp
from tailguard.config.base import _HEALTH, _RETRY, _Model


class TimeoutsConfig(_Model):
    """Deadlines per phase of a request once it leaves the gateway's queue."""

    connect_s: float = Field(default=5.0, gt=0, description="Opening the upstream connection and sending the request.")
    header_s: float = Field(
        default=5.0, gt=0,
        description="From sending upstream to the response head. A host that accepts connections and never "
        "answers is caught here and its request goes to another backend before any byte reached the client; "
        "a busy engine sends its head at once and waits for its first token under `first_token_s`. Not "
        "applied to llama.cpp's server, which sends its head only with the first token.",
    )
    first_token_s: float = Field(
        default=120.0, gt=0,
        description="From sending upstream to the first chunk carrying generated content (the role-only chunk does not count; covers a long prompt's prefill).",
    )
    idle_s: float = Field(default=30.0, gt=0, description="Longest gap between two upstream chunks.")
    total_s: float = Field(default=600.0, gt=0, description="Whole upstream request, from connect to the last byte.")


class HealthConfig(_Model):
    """Active health probes of each backend."""

    interval_s: float = Field(default=5.0, gt=0, description="Time between probes of one backend.")
    timeout_s: float = Field(default=2.0, gt=0, description="A probe slower than this counts as a failure.")
    unhealthy_after: int = Field(
        default=_HEALTH.unhealthy_after, ge=1,
        description="Consecutive failures (probes or connection errors) before a backend stops receiving requests.",
    )
    healthy_after: int = Field(
        default=_HEALTH.healthy_after, ge=1, description="Consecutive successful probes before an unhealthy backend is used again."
    )
    path: str = Field(default="/health", description="Probed path; any 2xx answer is healthy. When unset, each backend is probed at its kind's own path (`/health`, or `/v1/models` for `openai`, which has no health endpoint).")

    @field_validator("path")
    @classmethod
    def _path_ok(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"path {v!r} must start with '/'")
        return v


class RetryConfig(_Model):
    """Retries of a request whose upstream failed before any byte reached its client, and
    continuations (migrations) of a stream whose backend died or stalled mid-answer."""

    max_attempts: int = Field(
        default=_RETRY.max_attempts, ge=1,
        description="Attempts per request in all (1 = never retry). A reset or stale keep-alive connection "
        "is retried once on the same backend over a fresh connection; a refused connection, a 5xx or a "
        "429 on another backend with a free slot. Never once content has reached the client.",
    )
    max_migrations: int = Field(
        default=_RETRY.max_migrations, ge=0,
        description="Times a stream whose backend died or stalled (reset, closed early, idle deadline) after "
        "content reached the client is continued on another backend from its text so far (0 = never). Only "
        "for requests that can be continued from text (no tools, response_format, n > 1 or logprobs); never "
        "on the client's own cancel. Within the same budget as retries.",
    )
    budget_ratio: float = Field(
        default=_RETRY.budget_ratio, ge=0,
        description="Retries may be at most this share of the requests of the last 10 s (plus "
        "`min_retries_per_s`), so a failing backend cannot multiply the load (Envoy's `retry_budget`).",
    )
    min_retries_per_s: float = Field(
        default=_RETRY.min_retries_per_s, ge=0,
        description="Retries per second always allowed, whatever the request rate.",
    )

    def params(self) -> fp.RetryParams:
        return fp.RetryParams(max_attempts=self.max_attempts, max_migrations=self.max_migrations,
                              budget_ratio=self.budget_ratio,
                              min_retries_per_s=self.min_retries_per_s)
