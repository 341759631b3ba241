"""Suspend and continue: what the gateway keeps of a preemptible request's generation, and the
body that asks an engine to continue it; pure, no I/O.

A suspended request is resumed by sending the engine the same request with the text generated
so far appended: for chat, as a trailing assistant message the model continues
(`continue_final_message`, `add_generation_prompt: false`: vLLM's parameters; llama-server
continues a trailing assistant message by itself), for completions, after the prompt. Its
`max_tokens` shrinks by the tokens already generated, so the client gets what it asked for in
total. Only a request whose text is fully known can be continued like this (the intake decides
which: `tailguard.front.intake.resumable`).

Where every run so far came from an engine that returns token ids (vLLM's `return_token_ids`,
which the gateway asks for on a tracked stream) and the next one goes to such an engine, the
continuation is sent by token ids instead: `/v1/completions` with the first run's prompt ids and
every id generated since as its prompt (Dynamo's way: it appends the ids it tracked and lowers
`max_tokens`). Nothing is re-tokenised, so the model goes on from exactly the tokens it produced,
and the continuation's prompt count is exact. A chat client's stream stays chat: the run's
completions chunks are put in chat's shape (`wire.token_ids.as_chat_chunk`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tailguard.wire.chunks import content_text, delta_text, has_content, parse, running_usage
from tailguard.wire.openai import Endpoint
from tailguard.wire.sse import SSEDecoder
from tailguard.wire.token_ids import as_chat_chunk, generated_ids, ids_in, prompt_ids, shows_text
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, text_tokens

# Raw blocks a lazy stream keeps before parsing them: bounds its memory to about this many
# chunks' bytes beside its text.
_RAW_BLOCKS = 256


@dataclass(slots=True)
class Transcript:
    """A request's generation so far, kept across its runs (suspended and resumed, or moved to
    another backend when its own died mid-answer).

    The relay appends the text of every content chunk it has passed to the client (before
    writing it, so the count never runs behind what the client got); the dispatcher reads the
    count (`tokens`) for the front whenever it may preempt, and its suspension sets
    `suspended`, which the relay checks between chunks.
    """

    parts: list[str] = field(default_factory=list)
    tokens: int = 0  # content chunks relayed, over every run: the generated-token count
    # The most `tokens` counts: what the request allows (`gateway.upstream.bound`, set by its
    # tally); a backend that sends or counts more is not believed, nor charged for.
    most_tokens: int = 1 << 62
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
    # Token ids, kept while every run came from an engine that returns them (None: not, or no
    # longer): the first run's prompt and every generated token's, for a continuation by ids.
    ids: list[int] | None = None
    prompt_ids: list[int] | None = None
    # How many of `ids` the client has the text of: through the last chunk that carried text (an
    # engine holds back a token's text while it may be half a character or a stop string's start).
    shown_ids: int = 0
    hide_ids: bool = False  # the gateway asked for the ids, not the client: cut from its bytes
    as_chat: bool = False  # this run is a chat stream's continuation on /v1/completions

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
        self.tokens = min(self.most_tokens, self.base_tokens + run_tokens if run_tokens is not None else self.tokens + 1)

    def run_on(self, gives_ids: bool, client_ids: bool) -> None:
        """A run starts on a backend that returns token ids (`gives_ids`) or not: the ids stay
        whole only while every run's do. `client_ids`: the client asked for them itself."""
        if not gives_ids:
            self.ids = None
        elif self.ids is None and self.runs == 1 and not self.tokens:
            self.ids = []
        self.hide_ids = gives_ids and not client_ids

    def wants_ids(self) -> bool:
        """Its ids are kept and the first run's prompt ids have not come yet."""
        return self.ids is not None and self.prompt_ids is None

    def absorb(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A parsed chunk of this run: its token ids kept; returned in the client's shape."""
        if self.ids is not None:
            if self.prompt_ids is None:
                self.prompt_ids = prompt_ids(obj)
            ids = generated_ids(obj)
            if ids:
                self.ids.extend(ids)
                if shows_text(obj):
                    self.shown_ids = len(self.ids)
        return as_chat_chunk(obj) if self.as_chat else obj

    def by_ids(self) -> bool:
        """Every run's ids were kept and the client has text from them: it can be continued by
        the ids up to the last that showed text (those after it are generated again)."""
        return self.ids is not None and self.prompt_ids is not None and self.shown_ids > 0

    def keep(self, events: bytes, chat: bool) -> None:
        """Whole SSE events, some carrying content, passed to the client unparsed (`lazy`). The
        first is parsed at once (its response id); then a lone compact content chunk's text is
        read by its bytes (`wire.chunks.content_text`, and its token ids by `wire.token_ids.ids_in`
        while they are kept), and any other block kept raw."""
        text = content_text(events, chat) if self.tokens else None
        ids = ids_in(events) if text is not None and self.ids is not None else None
        if text is None or (self.ids is not None and ids is None):
            self.raw.append(events)
            if not self.tokens or len(self.raw) >= _RAW_BLOCKS:
                self.decode(chat)
            return
        if self.raw:
            self.decode(chat)  # what came before it first, in order
        if ids is not None and self.ids is not None:
            self.ids.extend(ids)
            self.shown_ids = len(self.ids)  # (content_text found text: it showed)
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
            if not isinstance(obj, dict):
                continue
            obj = self.absorb(obj)
            if not has_content(ev.data):
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


# What a continuation by token ids keeps of the client's request: the sampling, not the chat's
# messages, tools or formats (a request with those is never continued: the intake's `resumable`).
_SAMPLING = ("model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
             "spaces_between_special_tokens", "include_stop_str_in_output", "logit_bias", "user", "bad_words")


def continuation_body(body: dict[str, Any], endpoint: Endpoint, transcript: Transcript,
                      by_ids: bool = False) -> tuple[dict[str, Any], Endpoint]:
    """The request that continues `body` after `transcript`, and the endpoint it goes to; records
    in `transcript` where the new run starts (`base_tokens`, `added_prompt_tokens`), and that it is
    parsed as it goes. `by_ids`: the next backend takes a token-id prompt; used when the ids so
    far account for every token."""
    transcript.decode(endpoint == "chat")
    transcript.lazy = False
    transcript.as_chat = False
    text = transcript.text()
    done = transcript.tokens
    transcript.runs += 1
    transcript.base_tokens = done
    transcript.added_prompt_tokens = 0
    if not text:
        return body, endpoint  # nothing generated yet: start over
    if by_ids and transcript.by_ids() and not body.get("stop"):  # (a stop string's held text: by text)
        return _by_ids(body, endpoint, transcript), "completions"
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
    _shrink(body, out, names, done)
    transcript.added_prompt_tokens = added
    return out, endpoint


def _by_ids(body: dict[str, Any], endpoint: Endpoint, transcript: Transcript) -> dict[str, Any]:
    """A completions request whose prompt is the first run's prompt ids and every id generated
    since: its prompt count is exact (`added_prompt_tokens`), and a chat client's chunks are put
    back in chat's shape (`as_chat`)."""
    assert transcript.ids is not None and transcript.prompt_ids is not None
    # Ids past the last text shown are generated again, and counted again: not counted twice.
    del transcript.ids[transcript.shown_ids:]
    transcript.tokens = transcript.base_tokens = len(transcript.ids)
    out = {k: body[k] for k in _SAMPLING if k in body}
    out["prompt"] = transcript.prompt_ids + transcript.ids
    out["return_token_ids"] = True
    limit = body.get("max_completion_tokens") if endpoint == "chat" else None
    if limit is None:
        limit = body.get("max_tokens")
    _shrink({**body, "max_tokens": limit}, out, ("max_tokens",), transcript.tokens)
    transcript.added_prompt_tokens = len(transcript.ids)
    transcript.as_chat = endpoint == "chat"
    return out


def _shrink(body: dict[str, Any], out: dict[str, Any], names: tuple[str, ...], done: int) -> None:
    """The output bounds of `body` lowered by the `done` tokens already generated, into `out`."""
    for name in names:
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool):
            out[name] = max(1, v - done)
    m = body.get("min_tokens")
    if isinstance(m, int) and not isinstance(m, bool) and m > 0:
        out["min_tokens"] = max(0, m - done)
