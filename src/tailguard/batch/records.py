"""What the batch journal holds, as values: a stored file, a batch, one line of a batch, and the
OpenAI objects they are shown as (`file`, `batch`, the output and error lines); pure, no I/O.

The shapes are OpenAI's Batch API (platform.openai.com/docs/api-reference/batch): a batch's
`status` moves validating -> in_progress -> finalizing -> completed, or ends `failed` (its input
did not validate), `expired` (its window ended first) or `cancelled` (via `cancelling`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

# A batch's statuses, OpenAI's names. The runner works on the active ones; the others are final.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("failed", "completed", "expired", "cancelled")

# A line's states in the journal. `done` and `failed` are final: a line recorded so is never sent again.
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


def new_id(prefix: str) -> str:
    """An id in OpenAI's form (`file-...`, `batch_...`, `batch_req_...`)."""
    return prefix + secrets.token_hex(12)


@dataclass(slots=True)
class FileRecord:
    """An uploaded or produced file; its bytes are on disk (`batch.files`)."""

    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None = None

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "expires_at": self.expires_at,
                "status": "processed", "status_details": None}


TIMESTAMPS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
              "cancelled_at")


@dataclass(slots=True)
class BatchRecord:
    """A batch as the journal keeps it; `to_openai` is what `GET /v1/batches/{id}` answers."""

    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: dict[str, int] = field(default_factory=dict)  # in_progress_at ... cancelled_at, once reached
    total: int = 0
    completed: int = 0
    failed: int = 0
    # Not shown: the SHA-256 digest of the key that made it (its lines run as that key's requests;
    # None for batches recorded before it was kept), and the tokens its lines may use, counted
    # against the key's `batch_enqueued_tokens_limit` while it is active.
    owner_key: str | None = None
    enqueued_tokens: int = 0

    def to_openai(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window, "status": self.status,
            "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "expires_at": self.expires_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }
        body.update({k: self.times.get(k) for k in TIMESTAMPS})
        if self.errors:
            body["errors"] = {"object": "list", "data": self.errors}
        return body


@dataclass(slots=True, frozen=True)
class Line:
    """One request of a batch, as claimed from the journal to be run."""

    batch_id: str
    idx: int
    custom_id: str
    body: bytes
    attempts: int  # including the attempt this claim starts


def output_line(custom_id: str, status: int, body: Any, request_id: str) -> dict[str, Any]:
    """A line of the output file (2xx) or of the error file (another status): OpenAI's shape."""
    return {"id": new_id("batch_req_"), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None}


def error_line(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """A line of the error file for a line that got no response (`batch_expired`, `batch_cancelled`,
    or the gateway's own refusal after its last attempt)."""
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}
