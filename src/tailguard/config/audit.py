"""The gateway's config section for its audit trail (`audit:`): where the trail is kept, how long,
what it does when it cannot keep up, and whether request text is retained (redacted); pure."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from tailguard.config.base import _Model, shown_url


class AuditConfig(_Model):
    """An append-only, hash-chained record of every request, admin action and auth failure
    (docs/security.md, "The audit trail")."""

    enabled: bool = Field(default=False, description="Keep the audit trail.")
    store: str = Field(
        default="sqlite",
        description="`sqlite` (a file in the state directory, WAL mode) or a `postgresql://...` URL: replicas append to "
        "one table, each its own chain (needs `pip install 'tailguard[postgres]'`; a password in the URL is shown "
        "fingerprinted).")
    path: Path | None = Field(default=None, description="The SQLite file. Unset: `audit.sqlite3` in the gateway's state "
                              "directory (`tailguard serve --config FILE` has one).")
    chain: str | None = Field(
        default=None, max_length=128,
        description="This gateway's chain: its entries link to each other, not to another replica's. Unset: "
        "`<hostname>:<port>` (a worker of `serve --workers N` adds `/w<i>`). A restart continues its chain.")
    retain_text: bool = Field(
        default=False, description="Keep each request's prompt (and a non-stream answer) in its entry, redacted as "
        "`redaction:` says. Off: sizes only.")
    max_age_days: float = Field(default=365.0, gt=0, description="Entries older than this are deleted (checked hourly).")
    max_entries: int = Field(default=10_000_000, ge=1000, description="At most this many entries per chain; the oldest "
                             "go first (checked hourly).")
    queue_entries: int = Field(
        default=10_000, ge=10,
        description="Entries waiting to be written. Writing never blocks a request: a full queue counts "
        "`tailguard_audit_dropped_total` and logs once a minute, and `when_full` says what happens.")
    when_full: Literal["drop", "refuse"] = Field(
        default="drop",
        description="With the queue full: `drop` the entry (the trail then records a `gap` entry with how many were "
        "dropped) or `refuse` new requests with 503 `audit_unavailable` until it drains.")
    flush_s: float = Field(default=0.2, gt=0, le=10, description="How often queued entries are written (a crash loses "
                           "at most this much).")

    @field_validator("store")
    @classmethod
    def _known_store(cls, v: str) -> str:
        if v != "sqlite" and not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be `sqlite` or a postgresql:// URL")
        return v

    def shown_store(self) -> str:
        return shown_url(self.store)
