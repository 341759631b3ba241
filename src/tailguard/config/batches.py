"""The gateway's config section for OpenAI's Files and Batches API (`batches:`): where the journal
and the files live, the limits of an input file, the completion windows, per-line retries and
file retention (docs/batch.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from tailguard.config.base import _Model, require_extra


class BatchesConfig(_Model):
    """Batch jobs run through the gateway's own front as the lowest class (docs/batch.md)."""

    enabled: bool = Field(default=True, description="Serve `/v1/files` and `/v1/batches` (they also need `dir` or a "
                          "state directory: `tailguard serve --config FILE` has one).")
    dir: Path | None = Field(
        default=None,
        description="Where uploaded, output and error files are kept, and the SQLite journal (`journal.sqlite3`). "
        "Unset: `batches/` in the gateway's state directory.",
    )
    store: str = Field(
        default="sqlite",
        description="The journal: `sqlite` (a file in `dir`, WAL mode; one gateway) or a `postgresql://...` URL "
        "(several replicas share the batches, each line claimed with a lease; needs `pip install 'tailguard[postgres]'`).",
    )
    line_class: str | None = Field(
        default=None, description="The request class each line is run in. Unset: the class OpenAI's `flex` tier maps "
        "to (`batch` by default: the lowest rank, preemptible).")
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1, description="Largest upload (OpenAI's: 200 MB).")
    max_lines: int = Field(default=50_000, ge=1, description="Most lines in a batch input file (OpenAI's: 50,000).")
    max_window_s: float = Field(
        default=86_400.0, gt=0,
        description="Longest `completion_window` a batch may ask for (`24h`, or `<n>s`, `<n>m`, `<n>h` up to this); lines not "
        "run by then end as `batch_expired`.",
    )
    file_retention_s: float = Field(
        default=30 * 86_400.0, gt=0,
        description="How long files (inputs, outputs, errors) are kept before they expire and are deleted.",
    )
    line_attempts: int = Field(
        default=3, ge=1,
        description="Attempts of one line before it counts as failed, when it fails transiently (408, 409, 429, 502, "
        "503, 504: the client's own set): each retry waits a full-jitter draw from a window of `retry_base_s` doubled "
        "per attempt (at most 60 s), as `tailguard.client` does.",
    )
    retry_base_s: float = Field(default=1.0, gt=0, description="The window of a line's first retry's wait.")
    ahead: int = Field(
        default=2, ge=1,
        description="Lines kept waiting in the front's queue for the batch class: a line is added whenever fewer wait, "
        "so how many run follows the free slots, not a fixed number.",
    )
    lease_s: float = Field(
        default=30.0, gt=0,
        description="A line's claim while it runs (renewed every third of it); a replica that dies hands its lines "
        "to the others once their lease ends.",
    )
    poll_s: float = Field(default=1.0, gt=0, description="How often the journal is read for new or orphaned batches while any is "
                          "active; with none, every third of `lease_s` (a batch made here starts at once).")

    @field_validator("store")
    @classmethod
    def _store_known_and_installed(cls, v: str) -> str:
        if v.startswith(("postgresql://", "postgres://")):
            require_extra("postgres")
        elif v != "sqlite":
            raise ValueError(f"must be 'sqlite' or a postgresql:// URL, got {v!r}")
        return v
