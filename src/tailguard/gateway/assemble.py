"""The non-streaming answer: turns an upstream SSE stream into one `chat.completion` or
`text_completion` body (text, reasoning, tool calls, logprobs, finish reasons, usage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from tailguard.clock import monotonic
from tailguard.types import FailureKind
from tailguard.gateway.h1 import H1Response, UpstreamBroke
from tailguard.gateway.resume import Progress
from tailguard.gateway.tally import Tally
from tailguard.gateway.upstream import RelayError, Suspended
from tailguard.wire.chunks import delta_text, has_content, running_completion_tokens
from tailguard.wire.openai import Endpoint
from tailguard.wire.sse import DONE, SSEDecoder


@dataclass(slots=True)
class _ToolCall:
    """One tool call as its stream deltas build it: the id, type and name come once, the
    arguments in pieces."""

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
    parts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str = "reasoning_content"  # vLLM 0.10 and llama-server; newer vLLM says "reasoning"
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)
    # Chat: the `logprobs.content` entries in order. Completions: `tokens`, `token_logprobs`,
    # `top_logprobs`, `text_offset`, each the chunks' lists joined.
    logprobs: dict[str, list[Any]] | None = None
    finish_reason: str | None = None
    role: str = "assistant"

    def absorb_logprobs(self, lp: dict[str, Any]) -> None:
        if self.logprobs is None:
            self.logprobs = {}
        for key, items in lp.items():
            if isinstance(items, list):
                self.logprobs.setdefault(key, []).extend(items)


@dataclass(slots=True)
class Assembler:
    """Turns an upstream SSE stream into one `chat.completion` / `text_completion` body."""

    endpoint: Endpoint
    tally: Tally
    id: str = ""
    model: str = ""
    created: int = 0
    choices: dict[int, _Choice] = field(default_factory=dict)
    error: dict[str, Any] | None = None

    progress: Progress | None = None  # set for preemptible requests
    service_tier: str | None = None  # the tier to report, when the request named one

    async def run(self, up: H1Response) -> bytes:
        """Assemble until the upstream ends. A preemptible request's assembler outlives a
        suspension (`Suspended`) and keeps accumulating over the resumed run."""
        dec = SSEDecoder()
        prog = self.progress
        self.tally.start_run()
        done = False
        try:
            while data := await up.readany():
                if prog is not None and prog.suspended:
                    raise Suspended()
                now = monotonic()
                self.tally.watchdog.last_at = now
                for ev in dec.feed(data):
                    done = done or ev.data == DONE
                    self._absorb(ev.data, now)
            for ev in dec.flush():
                done = done or ev.data == DONE
                self._absorb(ev.data, monotonic())
        except UpstreamBroke as e:
            if prog is not None and prog.suspended:
                raise Suspended() from None
            raise RelayError(FailureKind.DISCONNECT, f"Backend closed the stream early: {e}") from None
        if prog is not None and prog.suspended and not done:
            raise Suspended()
        if self.error is not None:
            raise RelayError(FailureKind.STREAM_ERROR, str(self.error.get("message", "upstream error")))
        if prog is not None:
            usage = self.tally.usage
            usage.prompt_tokens, usage.completion_tokens = prog.client_usage(usage.prompt_tokens, usage.completion_tokens)
        return self.body()

    def _absorb(self, data: bytes, now: float) -> None:
        if data == DONE:
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RelayError(FailureKind.PROTOCOL, "Backend sent a chunk that is not JSON.") from None
        if not isinstance(obj, dict):
            return
        if "error" in obj and isinstance(obj["error"], dict):
            self.error = obj["error"]
            return
        self.tally.usage.read(obj)
        if not self.id:
            self.id = str(obj.get("id", ""))
            self.model = str(obj.get("model", ""))
            c = obj.get("created")
            self.created = c if isinstance(c, int) else 0
        for ch in obj.get("choices") or ():
            if isinstance(ch, dict):
                idx = ch.get("index", 0)
                slot = self.choices.get(idx)
                if slot is None:
                    slot = self.choices[idx] = _Choice()
                self._absorb_choice(slot, ch)
        if has_content(data):
            self.tally.content(now)
            if self.progress is not None:
                self.progress.add(delta_text(obj, self.endpoint == "chat"), running_completion_tokens(obj))

    def _absorb_choice(self, slot: _Choice, ch: dict[str, Any]) -> None:
        if self.endpoint == "chat":
            delta = ch.get("delta") or {}
            text = delta.get("content")
            if isinstance(delta.get("role"), str):
                slot.role = delta["role"]
            for key in ("reasoning_content", "reasoning"):
                reasoning = delta.get(key)
                if isinstance(reasoning, str) and reasoning:
                    slot.reasoning.append(reasoning)
                    slot.reasoning_key = key
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        i = call.get("index", 0)
                        slot.tool_calls.setdefault(i if isinstance(i, int) else 0, _ToolCall()).absorb(call)
        else:
            text = ch.get("text")
        lp = ch.get("logprobs")
        if isinstance(lp, dict):
            slot.absorb_logprobs(lp)
        if isinstance(text, str) and text:
            slot.parts.append(text)
        fr = ch.get("finish_reason")
        if isinstance(fr, str):
            slot.finish_reason = fr

    def text(self) -> str:
        return "".join("".join(c.parts) for _, c in sorted(self.choices.items()))

    def body(self) -> bytes:
        choices: list[dict[str, Any]] = []
        for idx, c in sorted(self.choices.items()):
            if self.endpoint == "chat":
                # As OpenAI answers: a message that only calls tools has `content: null`.
                content = "".join(c.parts) if c.parts or not c.tool_calls else None
                msg: dict[str, Any] = {"role": c.role, "content": content}
                if c.reasoning:
                    msg[c.reasoning_key] = "".join(c.reasoning)
                if c.tool_calls:
                    msg["tool_calls"] = [call.body() for _, call in sorted(c.tool_calls.items())]
                choices.append({"index": idx, "message": msg, "logprobs": c.logprobs,
                                "finish_reason": c.finish_reason or "stop"})
            else:
                choices.append({"index": idx, "text": "".join(c.parts), "logprobs": c.logprobs,
                                "finish_reason": c.finish_reason or "stop"})
        usage, t = self.tally.usage, self.tally.times
        pt = usage.prompt_tokens if usage.prompt_tokens is not None else t.prompt_tokens
        ct = usage.completion_tokens if usage.completion_tokens is not None else t.content_chunks
        out: dict[str, Any] = {
            "id": self.id, "object": "chat.completion" if self.endpoint == "chat" else "text_completion",
            "created": self.created, "model": self.model, "choices": choices,
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
        }
        if self.service_tier is not None:
            out["service_tier"] = self.service_tier
        return orjson.dumps(out)
