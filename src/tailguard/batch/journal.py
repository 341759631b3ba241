"""The batch journal's interface: every file, batch and line state, recorded as it changes, so a
gateway that dies loses nothing it had recorded. `batch.sqlite` (one gateway; the default) and
`batch.postgres` (replicas sharing the batches) implement it; the runner and the routes use only this.

A line's life: `queued` -> `running` (claimed by one holder, with a lease, `attempts` + 1) ->
`done` (a 2xx result, for the output file) or `failed` (an error result, for the error file), or
back to `queued` for a retry of a transient failure. A line `done` or `failed` is never claimed
again; a `running` line whose holder died is claimed again once its lease ends (SQLite: at once,
when the gateway opens the journal: it was the only holder). The idea of claims with leases and
idempotent per-line results is llm-d's batch gateway's (llm-d/llm-d-batch-gateway).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tailguard.batch.records import BatchRecord, FileRecord, Line


class Journal(Protocol):
    async def open(self) -> None:
        """Create the tables if needed; hand back what a dead holder left running (SQLite)."""
        ...

    async def close(self) -> None: ...

    # --- files ---
    async def add_file(self, rec: FileRecord) -> None: ...

    async def get_file(self, file_id: str) -> FileRecord | None: ...

    async def list_files(self, owner: str, purpose: str | None, after: str | None, limit: int) -> list[FileRecord]:
        """The owner's files, newest first, after the file `after` (OpenAI's cursor)."""
        ...

    async def delete_file(self, file_id: str) -> bool: ...

    async def expired_files(self, now: int) -> list[FileRecord]: ...

    # --- batches ---
    async def add_batch(self, rec: BatchRecord) -> None: ...

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        """The batch with its `request_counts` as its lines stand."""
        ...

    async def status(self, batch_id: str) -> str | None:
        """The batch's status alone (cheap: no counts)."""
        ...

    async def list_batches(self, owner: str, after: str | None, limit: int) -> list[BatchRecord]: ...

    async def active_batches(self) -> list[str]: ...

    async def enqueued_tokens(self, owner: str) -> int:
        """The tokens `owner`'s batches in progress (or finalizing, or being cancelled) hold: what a
        new batch of theirs is counted against; a batch that ended holds none."""
        ...

    async def transition(self, batch_id: str, allowed: tuple[str, ...], status: str, at: int | None,
                         changes: Mapping[str, object] | None = None) -> BatchRecord | None:
        """Move the batch to `status` (its timestamp `<status>_at` set to `at` unless None, `changes` applied)
        if its status is one of `allowed`, atomically; None when it was not (another replica, a
        cancel, came first)."""
        ...

    async def start(self, batch_id: str, lines: list[tuple[str, bytes]], at: int, enqueued_tokens: int = 0) -> bool:
        """Record a validated batch's lines (and the tokens they may use) and move it from
        `validating` to `in_progress`, in one transaction (a crash before leaves it `validating`,
        to be validated again)."""
        ...

    # --- lines ---
    async def claim(self, batch_id: str, n: int, holder: str, now: float, lease_s: float) -> list[Line]: ...

    async def renew(self, holder: str, now: float, lease_s: float) -> None: ...

    async def finish(self, line: Line, holder: str, ok: bool, result: bytes) -> bool:
        """Record a line's result once: False when the line is no longer this holder's."""
        ...

    async def release(self, holder: str) -> None:
        """Queue again every line `holder` is running (a gateway stopping on purpose)."""
        ...

    async def again(self, line: Line, holder: str, not_before: float, attempted: bool = True) -> None:
        """Queue the line again for a retry at `not_before` (a transient failure); not `attempted`
        (its caller's own rate limit refused it before it ran), its claim's attempt is given back."""
        ...

    async def close_open(self, batch_id: str, code: str, message: str) -> int:
        """End every line not yet done with the error `code` (`batch_expired`, `batch_cancelled`)."""
        ...

    async def open_lines(self, batch_id: str) -> int:
        """Lines of the batch still queued or running."""
        ...

    async def results(self, batch_id: str) -> list[tuple[bool, bytes]]:
        """Every ended line's (ok, result line), in input order."""
        ...

    async def failed_lines(self, batch_id: str) -> list[tuple[str, bytes]]:
        """The (custom_id, body) of each line that ended in the error file, in input order."""
        ...

    async def tally(self) -> tuple[dict[str, int], dict[str, int]]:
        """Lines of the active batches by state, and batches by status (for /metrics)."""
        ...
