"""A streamed answer joined back into the body a non-stream call gets: chat.completion.chunk or
text_completion chunks in, one chat.completion or text_completion out. Pure, standard library only
(the light client imports it): no I/O and no JSON; the caller parses each chunk and feeds the dict.

The gateway (`gateway/upstream/assemble.py`) and the client (`client/assembly.py`) both send a non-stream
call upstream as a stream, for its deadlines, and answer with what this joins, so both keep all
the stream carried, the same way:

- per choice, by `index`: the answer (chat `content`, completions `text`), `refusal`, reasoning
  (`reasoning_content` as vLLM 0.10 and llama-server send it, `reasoning` as newer vLLM does; each
  key joined on its own, so a server that sends both keeps both), the role, tool calls (deltas
  joined by their own `index`), logprobs (each list field concatenated), `finish_reason` ("stop"
  when the stream never said, as the gateway has always answered) and vLLM's `stop_reason`;
- once: `id`, `created`, `model`, `system_fingerprint`, `service_tier` (the first value sent) and
  the last `usage`.

An error object sent in place of a chunk (`{"error": {...}}`, as servers do when a generation fails
mid-stream) is kept in `error` and not joined: what to do about it is the caller's.

    joiner = ChunkJoiner(chat=True)
    for chunk in chunks:           # parsed JSON objects, in the order they came
        joiner.feed(chunk)
    body = joiner.finish()         # a dict: what the server would have answered to `stream: false`
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Fields a chunk carries once for the whole answer; the first value sent is kept.
_HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")
# OpenAI's body always has these; a stream that never sent one still gets a value of its type.
_HEAD_DEFAULTS = {"id": "", "created": 0, "model": ""}
# Text a delta carries in pieces, each key joined on its own (chat; completions have `text` only).
# Besides `content`, a message has a key only when the stream sent some of its text.
_MESSAGE_EXTRAS = ("refusal", "reasoning_content", "reasoning")
_CHAT_TEXTS = ("content", *_MESSAGE_EXTRAS)
_COMPLETION_TEXTS = ("text",)
# Choice fields that say how it ended; the last non-null value wins (a key sent only as null is kept as null).
_ENDINGS = ("finish_reason", "stop_reason")


@dataclass(slots=True)
class _ToolCall:
    """One tool call as its deltas build it: the id and type come once, the name and arguments in
    pieces."""

    id: str | None = None
    type: str = "function"
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)

    def absorb(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("id"), str):
            self.id = delta["id"]
        if isinstance(delta.get("type"), str):
            self.type = delta["type"]
        fn = delta.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                self.name.append(fn["name"])
            if isinstance(fn.get("arguments"), str):
                self.arguments.append(fn["arguments"])

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type,
                "function": {"name": "".join(self.name), "arguments": "".join(self.arguments)}}


@dataclass(slots=True)
class _Choice:
    texts: dict[str, list[str]] = field(default_factory=dict)  # key -> its non-empty pieces
    role: str = "assistant"
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)
    # Chat: the `logprobs.content` entries in order. Completions: `tokens`, `token_logprobs`,
    # `top_logprobs`, `text_offset`, each the chunks' lists joined.
    logprobs: dict[str, list[Any]] | None = None
    endings: dict[str, Any] = field(default_factory=dict)

    def absorb(self, choice: dict[str, Any], chat: bool) -> None:
        part = choice.get("delta") if chat else choice
        if isinstance(part, dict):
            self._absorb_texts(part, _CHAT_TEXTS if chat else _COMPLETION_TEXTS)
            if chat:
                self._absorb_delta(part)
        lp = choice.get("logprobs")
        if isinstance(lp, dict):
            self._absorb_logprobs(lp)
        for key in _ENDINGS:
            if key in choice and (choice[key] is not None or key not in self.endings):
                self.endings[key] = choice[key]

    def _absorb_texts(self, part: dict[str, Any], keys: tuple[str, ...]) -> None:
        for key in keys:
            piece = part.get(key)
            if isinstance(piece, str) and piece:
                self.texts.setdefault(key, []).append(piece)

    def _absorb_delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        for i, call in _by_index(delta.get("tool_calls")):
            self.tool_calls.setdefault(i, _ToolCall()).absorb(call)

    def _absorb_logprobs(self, lp: dict[str, Any]) -> None:
        if self.logprobs is None:
            self.logprobs = {}
        for key, items in lp.items():
            if isinstance(items, list):
                self.logprobs.setdefault(key, []).extend(items)

    def joined(self, key: str) -> str:
        return "".join(self.texts.get(key, ()))

    def message(self) -> dict[str, Any]:
        # As OpenAI answers: a message that only calls tools has `content: null`.
        content = self.joined("content") if "content" in self.texts or not self.tool_calls else None
        msg: dict[str, Any] = {"role": self.role, "content": content}
        for key in _MESSAGE_EXTRAS:
            if key in self.texts:
                msg[key] = self.joined(key)
        if self.tool_calls:
            msg["tool_calls"] = [call.body() for _, call in sorted(self.tool_calls.items())]
        return msg

    def body(self, index: int, chat: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index}
        if chat:
            out["message"] = self.message()
        else:
            out["text"] = self.joined("text")
        out["logprobs"] = None if self.logprobs is None else {k: list(v) for k, v in self.logprobs.items()}
        out["finish_reason"] = self.endings.get("finish_reason") or "stop"
        if "stop_reason" in self.endings:
            out["stop_reason"] = self.endings["stop_reason"]
        return out


class ChunkJoiner:
    """Joins parsed chunks of one streamed answer into its non-stream body (see the module
    docstring for what is kept)."""

    __slots__ = ("chat", "error", "_head", "_choices", "_usage")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.error: dict[str, Any] | None = None
        self._head: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if isinstance(chunk.get("error"), dict):
            self.error = chunk["error"]
            return
        for key in _HEAD:
            if key in chunk and self._head.get(key) is None:
                self._head[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for i, choice in _by_index(chunk.get("choices")):
            self._choices.setdefault(i, _Choice()).absorb(choice, self.chat)

    def text(self) -> str:
        """The answer text of every choice, in index order (no reasoning, no tool calls)."""
        key = "content" if self.chat else "text"
        return "".join(c.joined(key) for _, c in sorted(self._choices.items()))

    def finish(self) -> dict[str, Any]:
        """The body so far; the joiner is left as it was, so more may be fed and asked again."""
        head = self._head
        required = {key: default if head.get(key) is None else head[key] for key, default in _HEAD_DEFAULTS.items()}
        return {
            "id": required["id"], "object": "chat.completion" if self.chat else "text_completion",
            "created": required["created"], "model": required["model"],
            **{key: value for key, value in head.items() if key not in _HEAD_DEFAULTS},
            "choices": [c.body(i, self.chat) for i, c in sorted(self._choices.items())],
            "usage": self._usage,
        }


def _by_index(items: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """The objects of a JSON list (choices, tool calls) with their `index`: 0 when absent or not a
    number, as a server with one choice may send it; anything not an object is passed over."""
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                i = item.get("index", 0)
                yield (i if isinstance(i, int) and not isinstance(i, bool) else 0), item
