"""Every line of a batch's input file checked before any line runs; pure, no I/O.

A line is OpenAI's `{"custom_id", "method": "POST", "url", "body"}`; its body is checked as the
route itself would check it (`wire.openai.validate_body`). One bad line fails the whole batch,
with `errors` naming each bad line (1-based, as OpenAI's `line`), so nothing is half-run.

A valid file also says how many tokens its lines may use (each line's prompt estimate plus its
`n` x `max_tokens`, as the front reserves for a request): what the batch holds against its key's
`batch_enqueued_tokens_limit` while it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tailguard.errors import APIError
from tailguard.wire.openai import Endpoint, validate_body

_MOST_ERRORS = 100  # the errors listed for one batch: enough to fix a file, bounded for a hostile one
ENDPOINT_OF: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


@dataclass(frozen=True, slots=True)
class Checked:
    """The lines of a valid file (custom_id and body bytes, in order) and the tokens they may use,
    or the errors of a bad one."""

    lines: list[tuple[str, bytes]]
    errors: list[dict[str, Any]]
    tokens: int = 0


def check(data: bytes, url: str, max_lines: int) -> Checked:
    """The input file `data` for a batch of `url` (`/v1/chat/completions` or `/v1/completions`)."""
    endpoint = ENDPOINT_OF[url]
    raw_lines = [ln for ln in data.split(b"\n")]
    while raw_lines and not raw_lines[-1].strip():
        raw_lines.pop()
    if not raw_lines:
        return Checked([], [_error("empty_file", "The input file has no lines.", None)])
    if len(raw_lines) > max_lines:
        return Checked([], [_error("too_many_lines", f"The input file has {len(raw_lines)} lines; a batch takes at "
                                   f"most {max_lines}.", None)])
    lines: list[tuple[str, bytes]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    tokens = 0
    for n, raw in enumerate(raw_lines, start=1):
        try:
            custom_id, body, need = _line(raw, url, endpoint, seen)
        except _LineError as e:
            errors.append(_error(e.code, e.message, n, e.param))
            if len(errors) >= _MOST_ERRORS:
                break
            continue
        seen.add(custom_id)
        lines.append((custom_id, body))
        tokens += need
    return Checked(lines, errors, tokens) if not errors else Checked([], errors)


class _LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def _line(raw: bytes, url: str, endpoint: Endpoint, seen: set[str]) -> tuple[str, bytes, int]:
    """The line's custom_id, body and the tokens it may use, or the `_LineError` that names what is wrong."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _LineError("invalid_json", "This line is not valid JSON.") from None
    if not isinstance(obj, dict):
        raise _LineError("invalid_json", "This line is not a JSON object.")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _LineError("missing_required_parameter", "The line has no string `custom_id`.", "custom_id")
    if custom_id in seen:
        raise _LineError("duplicate_custom_id", f"The custom_id {custom_id!r} appears on an earlier line.", "custom_id")
    if obj.get("method") != "POST":
        raise _LineError("invalid_method", "The line's `method` must be `POST`.", "method")
    if obj.get("url") != url:
        raise _LineError("mismatched_endpoint", f"The line's `url` is {obj.get('url')!r}; this batch's endpoint is "
                         f"{url!r}.", "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise _LineError("invalid_request", "The line's `body` must be a JSON object.", "body")
    if body.get("stream"):
        raise _LineError("invalid_request", "A batch line cannot ask for `stream`.", "body.stream")
    try:
        parsed = validate_body(body, endpoint)
    except APIError as e:
        raise _LineError(e.code or "invalid_request", str(e), f"body.{e.param}" if e.param else "body") from None
    return custom_id, orjson.dumps(body), parsed.prompt_tokens + parsed.n * (parsed.max_tokens or 0)


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}
