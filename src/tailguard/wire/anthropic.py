"""Anthropic's Messages API (`POST /v1/messages`) on the wire: the request read for what the
gateway needs (prompt size, `max_tokens`, `stream`), the stream's typed events read for content
and usage, the error shape, and the events the simulator sends; pure, no I/O.

vLLM (vllm-project/vllm#21313, `entrypoints/anthropic`) and llama.cpp's server
(ggml-org/llama.cpp#17570) serve this route themselves, so the gateway forwards the body as it
came (LiteLLM's `/v1/messages` pass-through does the same for such backends) and reads:

    event: message_start        {"type":"message_start","message":{..., "usage":{"input_tokens":N,"output_tokens":1}}}
    event: content_block_start  {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}
    event: content_block_delta  {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}
    event: content_block_stop   {"type":"content_block_stop","index":0}
    event: message_delta        {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":N}}
    event: message_stop         {"type":"message_stop"}

Content is a `content_block_delta` (text, thinking, a tool call's JSON): the first is the first
token. Usage is `message_start`'s input and `message_delta`'s output (a running total).
Errors answer `{"type":"error","error":{"type":"invalid_request_error","message":...}}`.
"""

from __future__ import annotations

from typing import Any

import orjson

from tailguard.errors import APIError, BadRequest
from tailguard.wire.chunks import Usage
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, parts_text, text_tokens

# Anthropic's error types by HTTP status (docs.anthropic.com, "Errors").
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                413: "request_too_large", 415: "invalid_request_error", 429: "rate_limit_error",
                500: "api_error", 502: "api_error", 503: "overloaded_error", 504: "api_error",
                529: "overloaded_error"}
_ROLES = frozenset({"user", "assistant"})

MESSAGE_START = b'"type":"message_start"'
MESSAGE_DELTA = b'"type":"message_delta"'
BLOCK_DELTA = b'"type":"content_block_delta"'
MESSAGE_STOP = b'"type":"message_stop"'
ERROR = b'"type":"error"'


def error_body(err: APIError) -> bytes:
    """An `APIError` in Anthropic's shape (the Anthropic SDK reads `error.type` and `message`)."""
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}})


def error_event(err: APIError) -> bytes:
    """A stream that broke after the client got bytes ends with this event."""
    return b"event: error\ndata: " + error_body(err) + b"\n\n"


def prompt_text(body: dict[str, Any]) -> str:
    """`system` and every message's text, role-tagged (for the size estimate and prefix hashing)."""
    parts = [parts_text(body.get("system"))]
    for m in body.get("messages") or ():
        if isinstance(m, dict):
            parts.append(f"{m.get('role', '')}:{parts_text(m.get('content'))}\n")
    return "".join(parts)


def prompt_tokens(body: dict[str, Any]) -> int:
    """The estimated prompt of a validated body (`validate`), as a chat prompt is counted
    (`wire.openai`): the system text, and each message's text plus the per-message overhead."""
    return max(1, text_tokens(parts_text(body.get("system"))) + sum(
        CHAT_MESSAGE_OVERHEAD_TOKENS + text_tokens(parts_text(m.get("content"))) for m in body["messages"]))


def validate(body: dict[str, Any]) -> int:
    """Check what the gateway reads (`messages`, `max_tokens`, `stream`, `system`) as Anthropic's
    API does (`max_tokens` is required there); returns `max_tokens`. Raises `BadRequest`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: field required, a non-empty array", param="messages", code="invalid_value")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise BadRequest(f"messages.{i}.role: must be 'user' or 'assistant'", param=f"messages.{i}.role",
                             code="invalid_value")
        content = m.get("content")
        if not isinstance(content, (str, list)):
            raise BadRequest(f"messages.{i}.content: must be a string or an array of content blocks",
                             param=f"messages.{i}.content", code="invalid_type")
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise BadRequest("system: must be a string or an array of text blocks", param="system", code="invalid_type")
    mt = body.get("max_tokens")
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise BadRequest("max_tokens: field required, an integer of at least 1", param="max_tokens",
                         code="invalid_value")
    return mt


# --- the stream, read by its bytes ---------------------------------------------------------------

def has_content(data: bytes, start: int = 0, end: int | None = None) -> bool:
    """A `content_block_delta` (text, thinking or a tool call's input): a generated token."""
    return data.find(BLOCK_DELTA, start, len(data) if end is None else end) >= 0


def has_usage(data: bytes, start: int = 0, end: int | None = None) -> bool:
    e = len(data) if end is None else end
    return data.find(MESSAGE_START, start, e) >= 0 or data.find(MESSAGE_DELTA, start, e) >= 0


def is_error(data: bytes, start: int = 0, end: int | None = None) -> bool:
    return data.find(ERROR, start, len(data) if end is None else end) >= 0


def is_last(data: bytes, start: int = 0, end: int | None = None) -> bool:
    return data.find(MESSAGE_STOP, start, len(data) if end is None else end) >= 0


# Anthropic's `input_tokens` leaves out the prompt tokens read from or written to its cache: the
# prompt is all three (llama-server answers a repeated prompt with `input_tokens` 1 and the rest
# as `cache_read_input_tokens`).
_CACHED_INPUT = ("cache_read_input_tokens", "cache_creation_input_tokens")


def read_usage(usage: Usage, obj: Any) -> None:
    """`message_start`'s input tokens, `message_delta`'s output tokens (its running total), or a
    whole message's `usage` (a non-stream answer); the input counts the cached tokens too."""
    if not isinstance(obj, dict):
        return
    start = obj.get("type") == "message_start"  # its output_tokens is not a count yet
    holder = obj.get("message") if start else obj
    u = holder.get("usage") if isinstance(holder, dict) else None
    usage.read_io(u, output=not start)
    if isinstance(u, dict) and usage.prompt_tokens is not None and _count(u.get("input_tokens")):
        for name in _CACHED_INPUT:
            v = u.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                usage.prompt_tokens += v


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --- what an engine sends (the simulator) --------------------------------------------------------

def event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def message(mid: str, model: str, text: str, stop_reason: str | None, input_tokens: int,
            output_tokens: int) -> dict[str, Any]:
    content = [{"type": "text", "text": text}] if stop_reason is not None else []
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def stop_reason(finish_reason: str) -> str:
    """OpenAI's finish reason as Anthropic names it."""
    return {"length": "max_tokens", "stop": "end_turn"}.get(finish_reason, "end_turn")
