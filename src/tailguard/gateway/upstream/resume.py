"""Suspend and continue: what the gateway keeps of a preemptible request's generation, and the
body that asks an engine to continue it; pure, no I/O.

A suspended request is resumed by sending the engine the same request with the text generated
so far appended: for chat, as a trailing assistant message the model continues
(`continue_final_message`, `add_generation_prompt: false`: vLLM's parameters; llama-server
continues a trailing assistant message by itself), for completions, after the prompt. Its
`max_tokens` shrinks by the tokens already generated, so the client gets what it asked for in
total. Only a request whose text is fully known can be continued like this (the intake decides
which: `tailguard.front.intake.resumable`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tailguard.wire.chunks import content_text, delta_text, has_content, parse, running_usage
from tailguard.wire.openai import Endpoint
from tailguard.wire.sse import SSEDecoder
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, text_tokens

# Raw blocks a lazy stream keeps before parsing them: bounds its memory to about this many
# chunks' bytes beside its text.
_RAW_BLOCKS = 256


@dataclass(slots=True)
class Progress:
    """A request's generation so far, kept across its runs (suspended and resumed, or moved to
    another backend when its own died mid-answer).

    The relay appends the text of every content chunk it has passed to the client (before
    writing it, so the count never runs behind what the client got), and the dispatcher's
    suspension sets `suspended`, which the relay checks between chunks.
    """

    parts: list[str] = field(default_factory=list)
    tokens: int = 0  # content chunks relayed, over every run: the generated-token count
    base_tokens: int = 0  # tokens generated before the current run
    added_prompt_tokens: int = 0  # estimated tokens the current run's continuation added to the prompt
    # The first run's prompt as its engine counted it, where the engine puts a running usage on
    # every chunk (vLLM): the client's prompt count, exact, whatever a continuation added.
    prompt_tokens: int | None = None
    runs: int = 1
    suspended: bool = False
    # A stream that may be moved but never suspended is relayed unparsed (the push path): its
    # relay hands each block of content events to `keep`, which reads the text of the usual
    # compact chunk by its bytes and keeps any other block raw, parsed only when it must be
    # continued or every `_RAW_BLOCKS` blocks. A continuation's run is parsed as it goes.
    lazy: bool = False
    raw: list[bytes] = field(default_factory=list)
    first_id: str | None = None  # the response id of its first run's chunks, as `decode` read it
    # Told every new count: the dispatcher passes it to the front as `Generated`, what a
    # preemption weighs (the front never asks its driver).
    on_tokens: Callable[[int], None] | None = None

    def text(self) -> str:
        return "".join(self.parts)

    def add(self, text: str, run_tokens: int | None = None, run_prompt_tokens: int | None = None) -> None:
        """A content chunk passed to the client. `run_tokens` is the backend's running count of
        this run's tokens when it sends one (vLLM packs several tokens into a chunk when its API
        server lags, so counting chunks would fall short); else a chunk counts as one token.
        `run_prompt_tokens`: the prompt count of that running usage."""
        self.parts.append(text)
        if self.runs == 1 and run_prompt_tokens is not None:
            self.prompt_tokens = run_prompt_tokens
        self.tokens = self.base_tokens + run_tokens if run_tokens is not None else self.tokens + 1
        if self.on_tokens is not None:
            self.on_tokens(self.tokens)

    def keep(self, events: bytes, chat: bool) -> None:
        """Whole SSE events, some carrying content, passed to the client unparsed (`lazy`). The
        first is parsed at once (its response id); then a lone compact content chunk's text is
        read by its bytes (`wire.chunks.content_text`), and any other block kept raw."""
        text = content_text(events, chat) if self.tokens else None
        if text is None:
            self.raw.append(events)
            if not self.tokens or len(self.raw) >= _RAW_BLOCKS:
                self.decode(chat)
            return
        if self.raw:
            self.decode(chat)  # what came before it first, in order
        self.add(text)

    def decode(self, chat: bool) -> None:
        """Parse what `keep` kept into the text and token count, as a tracked relay would have."""
        if not self.raw:
            return
        dec = SSEDecoder()
        events = dec.feed(b"".join(self.raw))
        self.raw = []
        for ev in events + dec.flush():
            obj = parse(ev.data)
            if not isinstance(obj, dict) or not has_content(ev.data):
                continue
            if self.first_id is None and isinstance(obj.get("id"), str):
                self.first_id = obj["id"]
            pt, ct = running_usage(obj)
            self.add(delta_text(obj, chat), ct, pt)

    def client_usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> tuple[int | None, int | None]:
        """The upstream usage of the current run as the client should see it: the original
        prompt (as the first run counted it, else the continuation's prompt minus what it added)
        and every token generated."""
        if self.runs == 1:
            return prompt_tokens, completion_tokens
        pt = self.prompt_tokens
        if pt is None and prompt_tokens is not None:
            pt = max(1, prompt_tokens - self.added_prompt_tokens)
        ct = self.base_tokens + (completion_tokens if completion_tokens is not None else self.tokens - self.base_tokens)
        return pt, ct


def continuation_body(body: dict[str, Any], endpoint: Endpoint, progress: Progress) -> dict[str, Any]:
    """The request that continues `body` after `progress`; records in `progress` where the new
    run starts (`base_tokens`, `added_prompt_tokens`), and that it is parsed as it goes."""
    progress.decode(endpoint == "chat")
    progress.lazy = False
    text = progress.text()
    done = progress.tokens
    progress.runs += 1
    progress.base_tokens = done
    progress.added_prompt_tokens = 0
    if not text:
        return body  # nothing generated yet: start over
    out = dict(body)
    if endpoint == "chat":
        messages = list(body["messages"])
        last = messages[-1]
        if body.get("continue_final_message") and isinstance(last, dict) and last.get("role") == "assistant":
            messages[-1] = {**last, "content": str(last.get("content", "")) + text}
            added = text_tokens(text)
        else:
            messages.append({"role": "assistant", "content": text})
            added = CHAT_MESSAGE_OVERHEAD_TOKENS + text_tokens(text)
        out["messages"] = messages
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
        names: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
    else:
        out["prompt"] = str(body["prompt"]) + text
        added = text_tokens(str(body["prompt"]) + text) - text_tokens(str(body["prompt"]))
        names = ("max_tokens",)
    for name in names:
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool):
            out[name] = max(1, v - done)
    m = body.get("min_tokens")
    if isinstance(m, int) and not isinstance(m, bool) and m > 0:
        out["min_tokens"] = max(0, m - done)
    progress.added_prompt_tokens = added
    return out
