"""What a streamed chat or completions chunk carries: generated content, usage, an error; pure,
no I/O. The one definition the gateway and the bench both measure by.

A chunk carries *content* when it has a non-empty `content`, `reasoning_content`, `reasoning` or
`text` string, or a non-empty `tool_calls` list: a reasoning model's thinking and a tool call's
arguments are generated tokens, so the first of them is the first token. Role-only chunks
(`"content":""`), `null` content and usage-only chunks (`"choices":[]`) carry none.

The byte scans (`has_content`, `has_usage`, `is_error`) run once per chunk on the relay's hot
path, so they look at bytes and never parse JSON; they take a range so a relay can scan an event
inside the buffer it read without slicing it out. Only the rare chunks they pick out are parsed.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any

import orjson

from tailguard.speedups import speedups

# Keys whose non-empty string (or list) value is generated content. JSON escapes quotes inside
# strings, so `"content":` never matches inside a tool call's arguments or the text itself.
CONTENT_KEYS = (b'"content":', b'"text":', b'"reasoning_content":', b'"reasoning":', b'"tool_calls":')
_COMPACT_CONTENT = b'"content":"'
_USAGE_KEY = b'"usage":'
_COMPACT_TEXT = b'"text":"'
_TIER_VALUE = re.compile(rb'"service_tier":\s*(null|"[^"]*")')
_DATA_OPEN = re.compile(rb"(?:^|(?<=[\r\n]))data: ?\{")  # an event's JSON opening, with or without the space
_QUOTE, _BRACKET, _CLOSE_BRACKET, _BRACE, _SPACE = 0x22, 0x5B, 0x5D, 0x7B, 0x20


@dataclass(slots=True)
class Usage:
    """The token counts of a stream's usage chunk (the last one seen wins)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    answer_id: str | None = None  # a Response's id, where its final event names it (a follow-up continues it)

    def read(self, obj: Any) -> bool:
        """Copy the counts of a parsed chunk's `usage`; True if the chunk is usage-only."""
        if not isinstance(obj, dict):
            return False
        u = obj.get("usage")
        if isinstance(u, dict):
            pt, ct = u.get("prompt_tokens"), u.get("completion_tokens")
            if isinstance(pt, int):
                self.prompt_tokens = pt
            if isinstance(ct, int):
                self.completion_tokens = ct
        return obj.get("choices") == []

    def read_io(self, u: Any, *, output: bool = True) -> None:
        """Copy a `usage` object's `input_tokens` (and `output_tokens` with `output`): the names
        of the Responses API and of Anthropic's Messages API."""
        if not isinstance(u, dict):
            return
        it, ot = u.get("input_tokens"), u.get("output_tokens")
        if isinstance(it, int) and not isinstance(it, bool):
            self.prompt_tokens = it
        if output and isinstance(ot, int) and not isinstance(ot, bool):
            self.completion_tokens = ot


def has_content_py(data: bytes, start: int = 0, end: int | None = None) -> bool:
    """True if the chunk in data[start:end] carries generated content (see the module docstring).
    `has_content` is this, or its twin in C (`tailguard.speedups`).

    Each search takes one argument (the event is cut out first when it is part of `data`): a
    bounded `find` parses two more, a cost in each of the six searches an event without
    content takes; and `partition` parses none."""
    if start or (end is not None and end != len(data)):
        data = data[start:end]
    # The usual content chunk first, in one search: compact JSON with a non-empty answer string.
    _, key, rest = data.partition(_COMPACT_CONTENT)
    if key and rest and rest[0] != _QUOTE:
        return True
    end = len(data)
    for key in CONTENT_KEYS:
        i = data.find(key)
        while i >= 0:
            j = i + len(key)
            while j < end and data[j] == _SPACE:
                j += 1
            if j + 1 < end:
                c = data[j]
                if c == _QUOTE and data[j + 1] != _QUOTE:  # a non-empty string
                    return True
                if c == _BRACKET and data[j + 1] != _CLOSE_BRACKET:  # a non-empty list (tool_calls)
                    return True
            i = data.find(key, j)
    return False


has_content = has_content_py if speedups is None else speedups.has_content


def has_usage(data: bytes, start: int = 0, end: int | None = None) -> bool:
    """True if the chunk in data[start:end] carries a `usage` object (not `null`)."""
    if end is None:
        end = len(data)
    i = data.find(_USAGE_KEY, start, end)
    if i < 0:
        return False
    j = i + len(_USAGE_KEY)
    while j < end and data[j] == _SPACE:
        j += 1
    return j < end and data[j] == _BRACE


_FINISH_KEY = b'"finish_reason":'
_ID_KEY = b'"id":"'
MAX_FINISH_REASON = 64  # bytes of one reason kept: a hostile backend's string is cut there
MAX_RESPONSE_ID = 128


def _string_at(data: bytes, j: int, end: int, limit: int) -> tuple[str | None, int]:
    """The JSON string value opening at data[j] (cut to `limit` bytes) and where it closes; None
    (and j) if a string does not open there (`null`) or does not close before `end`."""
    if j >= end or data[j] != _QUOTE:
        return None, j
    k = data.find(b'"', j + 1, end)
    if k < 0:
        return None, j
    return data[j + 1:min(k, j + 1 + limit)].decode(errors="replace"), k


def finish_reasons(data: bytes, start: int = 0, end: int | None = None) -> list[str]:
    """Every non-null `finish_reason` in data[start:end], in order (one per choice that ended in
    the chunk), found by its bytes; each cut to MAX_FINISH_REASON. Reason words hold no escapes."""
    if end is None:
        end = len(data)
    out: list[str] = []
    i = data.find(_FINISH_KEY, start, end)
    while i >= 0:
        j = i + len(_FINISH_KEY)
        while j < end and data[j] == _SPACE:
            j += 1
        reason, j = _string_at(data, j, end, MAX_FINISH_REASON)
        if reason is not None:
            out.append(reason)
        i = data.find(_FINISH_KEY, j, end)
    return out


def response_id(data: bytes, start: int = 0, end: int | None = None) -> str | None:
    """The first `"id":"..."` in data[start:end]: a stream's first event is its response's, whose
    top-level `id` comes before any tool call's (OpenAI, vLLM, llama.cpp); cut to MAX_RESPONSE_ID."""
    if end is None:
        end = len(data)
    i = data.find(_ID_KEY, start, end)
    return None if i < 0 else _string_at(data, i + len(_ID_KEY) - 1, end, MAX_RESPONSE_ID)[0]


def content_text(event: bytes, chat: bool) -> str | None:
    """The text of one whole content event in the compact shape engines send (`"content":"..."`
    in a chat delta, `"text":"..."` in a completion; one choice, one data line), found by its
    bytes: what `delta_text` returns from the parsed chunk. None where only a parse can tell: an
    escape in the string, a running usage, more than one event or line, another shape."""
    key = _COMPACT_CONTENT if chat else _COMPACT_TEXT
    i = event.find(key)
    if i < 0 or event.find(key, i + 1) >= 0 or event.count(b"data:") != 1 or has_usage(event):
        return None
    start = i + len(key)
    end = event.find(b'"', start)
    if end < 0 or event.find(b"\\", start, end) >= 0:
        return None
    try:
        return event[start:end].decode()
    except UnicodeDecodeError:
        return None


def is_error(data: bytes, start: int = 0, end: int | None = None) -> bool:
    """True if the chunk in data[start:end] is an error object (`{"error": ...}`), which servers
    send in place of a chunk when a generation fails mid-stream."""
    if end is None:
        end = len(data)
    i = data.find(b"{", start, end)
    if i < 0:
        return False
    j = i + 1
    while j < end and data[j] == _SPACE:
        j += 1
    return data.startswith(b'"error"', j)


def with_service_tier(data: bytes, tier: bytes) -> bytes:
    """Every JSON event in `data` saying `"service_tier": tier`: an engine's own value (vLLM
    writes null) is replaced, else the field is put first. Bytes only, no parse; used only for
    requests that named a tier, so the common stream pays nothing."""
    value = b'"service_tier":"' + tier + b'"'
    if b'"service_tier":' in data:
        return _TIER_VALUE.sub(value, data)
    return _DATA_OPEN.sub(lambda m: m.group(0) + value + b",", data)


def parse(data: bytes) -> Any:
    """A chunk's JSON, or None if it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def usage_of(data: bytes) -> dict[str, Any] | None:
    """The `usage` object of a chunk, parsed only when the bytes show a non-null one."""
    if not has_usage(data):
        return None
    obj = parse(data)
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None


def running_usage(obj: dict[str, Any]) -> tuple[int | None, int | None]:
    """The run's prompt and generated tokens so far, where the backend puts a running `usage` on
    every chunk (vLLM's `continuous_usage_stats`); (None, None) where it does not."""
    u = obj.get("usage")
    if not isinstance(u, dict):
        return None, None
    pt, ct = u.get("prompt_tokens"), u.get("completion_tokens")
    return (pt if isinstance(pt, int) and not isinstance(pt, bool) else None,
            ct if isinstance(ct, int) and not isinstance(ct, bool) else None)


def delta_text(obj: dict[str, Any], chat: bool) -> str:
    """The answer text a parsed chunk carries (first choice; preemptible requests have one)."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    ch = choices[0]
    if chat:
        delta = ch.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
    else:
        text = ch.get("text")
    return text if isinstance(text, str) else ""


def role_only(obj: dict[str, Any]) -> bool:
    """A chunk with no text and no finish reason (the role-only first chunk of a chat stream)."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for ch in choices:
        if not isinstance(ch, dict) or ch.get("finish_reason") is not None:
            return False
    return True
