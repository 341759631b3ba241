"""OpenAI's Responses API (`POST /v1/responses`) on the wire: the request read for what the
gateway needs (prompt size, `max_output_tokens`, `stream`, the stored state it continues), the
stream's typed events read for content and usage, and the events the simulator sends; pure, no I/O.

vLLM serves this route itself (`entrypoints/openai/serving_responses.py`); the gateway forwards
the body as it came and reads the stream by each event's `type`:

    event: response.created            {"type":"response.created","response":{"id":"resp_...",...},"sequence_number":0}
    event: response.output_text.delta  {"type":"response.output_text.delta","delta":"Hi",...}
    event: response.completed          {"type":"response.completed","response":{...,"usage":{"input_tokens":N,"output_tokens":M}}}

Content is any `*.delta` event (output text, reasoning text, a refusal, a function call's
arguments): the first is the first token. Usage is in the final `response.completed`
(`response.incomplete` when cut at `max_output_tokens`, `response.failed`). There is no
`[DONE]`: the final event ends the stream. Errors mid-stream are `{"type":"error",...}` events.
"""

from __future__ import annotations

from typing import Any

import orjson

from tailguard.errors import APIError, BadRequest
from tailguard.wire.chunks import Usage
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, parts_text, text_tokens

_TYPE = b'"type":"response.'
_DELTA = b".delta"
_FINAL = (b'"type":"response.completed"', b'"type":"response.incomplete"', b'"type":"response.failed"')
_ERROR = (b'"type":"error"', b'"type":"response.failed"')


def prompt_text(body: dict[str, Any]) -> str:
    """`instructions` and the input's text, role-tagged (for the size estimate and prefix hashing)."""
    parts = [parts_text(body.get("instructions"))]
    items = body.get("input")
    if isinstance(items, str):
        parts.append(items)
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                parts.append(f"{item.get('role', item.get('type', ''))}:{parts_text(item.get('content'))}"
                             f"{parts_text(item.get('output'))}{parts_text(item.get('arguments'))}\n")
    return "".join(parts)


def prompt_tokens(body: dict[str, Any]) -> int:
    """As a chat prompt is counted (`wire.openai`): each input item's text plus the per-message
    overhead (a string input is one user message), and the instructions."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"content": items}]
    total = text_tokens(parts_text(body.get("instructions")))
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict):
            text = parts_text(item.get("content")) + parts_text(item.get("output")) + parts_text(item.get("arguments"))
            total += CHAT_MESSAGE_OVERHEAD_TOKENS + text_tokens(text)
    return max(1, total)


def validate(body: dict[str, Any]) -> int | None:
    """Check what the gateway reads (`input`, `instructions`, `max_output_tokens`,
    `previous_response_id`); returns `max_output_tokens`. Raises `BadRequest`."""
    items = body.get("input")
    if not isinstance(items, (str, list)) or (isinstance(items, list) and not all(isinstance(i, dict) for i in items)):
        raise BadRequest("'input' must be a string or an array of input items.", param="input", code="invalid_type")
    for name in ("instructions", "previous_response_id"):
        v = body.get(name)
        if v is not None and not isinstance(v, str):
            raise BadRequest(f"'{name}' must be a string.", param=name, code="invalid_type")
    mot = body.get("max_output_tokens")
    if mot is None:
        return None
    if isinstance(mot, bool) or not isinstance(mot, int) or mot < 1:
        raise BadRequest("'max_output_tokens' must be an integer of at least 1.", param="max_output_tokens",
                         code="invalid_value")
    return mot


# --- the stream, read by its bytes ---------------------------------------------------------------

def has_content(data: bytes, start: int = 0, end: int | None = None) -> bool:
    """A `response.*.delta` event: the type names end in `.delta` exactly for generated pieces."""
    e = len(data) if end is None else end
    i = data.find(_TYPE, start, e)
    if i < 0:
        return False
    j = data.find(b'"', i + len(_TYPE), e)
    return j > 0 and data[j - len(_DELTA):j] == _DELTA


def has_usage(data: bytes, start: int = 0, end: int | None = None) -> bool:
    e = len(data) if end is None else end
    return any(data.find(f, start, e) >= 0 for f in _FINAL)


is_last = has_usage  # the final event carries the usage and ends the stream


def is_error(data: bytes, start: int = 0, end: int | None = None) -> bool:
    e = len(data) if end is None else end
    return any(data.find(f, start, e) >= 0 for f in _ERROR)


def read_usage(usage: Usage, obj: Any) -> None:
    """The usage of a final event's `response`, or of a whole response (a non-stream answer)."""
    if not isinstance(obj, dict):
        return
    holder = obj.get("response") if isinstance(obj.get("response"), dict) else obj
    usage.read_io(holder.get("usage") if isinstance(holder, dict) else None)
    usage.answer_id = response_id(obj) or usage.answer_id


def response_id(obj: Any) -> str | None:
    """The id of the response a `response.created` event (or a whole response) names."""
    if not isinstance(obj, dict):
        return None
    holder = obj.get("response") if isinstance(obj.get("response"), dict) else obj
    rid = holder.get("id") if isinstance(holder, dict) else None
    return rid if isinstance(rid, str) else None


def error_event(err: APIError, sequence_number: int = 0) -> bytes:
    """A stream that broke after the client got bytes ends with this event."""
    return event("error", {"type": "error", "code": err.code, "message": err.message, "param": err.param,
                           "sequence_number": sequence_number})


# --- what an engine sends (the simulator) --------------------------------------------------------

def event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def response(rid: str, model: str, created: int, text: str | None, status: str, input_tokens: int,
             output_tokens: int, max_output_tokens: int | None) -> dict[str, Any]:
    """A `response` object: its output is one assistant message once it has ended (`text`)."""
    output = [] if text is None else [message_item(rid, text, "completed")]
    usage = None if text is None else {
        "input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens}
    return {"id": rid, "object": "response", "created_at": created, "model": model, "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "temperature": 1.0, "top_p": 1.0, "max_output_tokens": max_output_tokens, "usage": usage,
            "error": None, "instructions": None, "metadata": {}, "text": {"format": {"type": "text"}}}


def message_item(rid: str, text: str, status: str) -> dict[str, Any]:
    return {"id": f"msg_{rid}", "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
