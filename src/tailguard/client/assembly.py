"""A non-stream call sent as a stream: the request rewritten to stream, and the chunks joined back
into the response body the caller asked for. Pure: no I/O.

Streaming underneath is what gives a non-stream call the same deadlines as a stream (a server
answering `stream: false` sends nothing until it is done, so a first token or a stall cannot be
seen), and, since nothing reaches the caller before the end, lets any failed try be retried.
"""

from __future__ import annotations

import json
from typing import Any

from tailguard.wire.sse import DONE, SSEDecoder


def streaming_body(body: bytes) -> bytes:
    """The same request, streamed, with usage in the last chunk."""
    obj = json.loads(body)
    obj["stream"] = True
    obj["stream_options"] = {**(obj.get("stream_options") or {}), "include_usage": True}
    return json.dumps(obj).encode()


class Assembler:
    """Joins chat or completions chunks into one response object.

        asm = Assembler(chat=True)
        asm.feed(raw_bytes) ...
        body = asm.body()          # what the server would have answered to `stream: false`
    """

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self._decoder = SSEDecoder()
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: Any = None

    def feed(self, data: bytes) -> None:
        for event in self._decoder.feed(data):
            if event.data == DONE:
                continue
            obj = json.loads(event.data)
            if isinstance(obj, dict):
                self._take(obj)

    def _take(self, obj: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in obj and key not in self._head:
                self._head[key] = obj[key]
        if obj.get("usage") is not None:
            self._usage = obj["usage"]
        for choice in obj.get("choices") or []:
            slot = self._choices.setdefault(int(choice.get("index", 0)), {"finish_reason": None})
            if choice.get("finish_reason") is not None:
                slot["finish_reason"] = choice["finish_reason"]
            if self._chat:
                _join_delta(slot, choice.get("delta") or {})
            else:
                slot["text"] = slot.get("text", "") + (choice.get("text") or "")

    def body(self) -> bytes:
        choices = []
        for index in sorted(self._choices):
            slot = self._choices[index]
            if self._chat:
                choices.append({"index": index, "message": _message(slot), "finish_reason": slot["finish_reason"],
                                "logprobs": None})
            else:
                choices.append({"index": index, "text": slot.get("text", ""), "finish_reason": slot["finish_reason"],
                                "logprobs": None})
        obj = {**self._head, "object": "chat.completion" if self._chat else "text_completion",
               "choices": choices, "usage": self._usage}
        return json.dumps(obj).encode()


def _join_delta(slot: dict[str, Any], delta: dict[str, Any]) -> None:
    if delta.get("role"):
        slot["role"] = delta["role"]
    for key in ("content", "reasoning_content"):
        if delta.get(key):
            slot[key] = slot.get(key, "") + delta[key]
    for call in delta.get("tool_calls") or []:
        calls = slot.setdefault("tool_calls", {})
        joined = calls.setdefault(int(call.get("index", 0)), {"id": None, "type": "function",
                                                              "function": {"name": "", "arguments": ""}})
        joined["id"] = call.get("id") or joined["id"]
        joined["type"] = call.get("type") or joined["type"]
        fn = call.get("function") or {}
        joined["function"]["name"] += fn.get("name") or ""
        joined["function"]["arguments"] += fn.get("arguments") or ""


def _message(slot: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": slot.get("role", "assistant"), "content": slot.get("content")}
    if "reasoning_content" in slot:
        message["reasoning_content"] = slot["reasoning_content"]
    if "tool_calls" in slot:
        message["tool_calls"] = [slot["tool_calls"][i] for i in sorted(slot["tool_calls"])]
    elif message["content"] is None:
        message["content"] = ""
    return message
