"""What the simulator answers on the Responses API and Anthropic's Messages API, as bytes: the
typed SSE events of a streamed answer and the JSON body of a whole one, with every generated
token TOKEN_TEXT as on the other routes; pure, no I/O. Shapes as vLLM sends them
(`serving_responses.py`; `entrypoints/anthropic`) and as the openai and anthropic SDKs read them.

    chunks = chunks_for("responses", rid, model, created, prompt_tokens=12, max_tokens=64)
    chunks.more(sent=0, n=3) ... chunks.end(sent=3, n=2, reason="length")
"""

from __future__ import annotations

from typing import Protocol

import orjson

from tailguard.sim.answer import TOKEN_TEXT, Chunks, response_body
from tailguard.wire import anthropic, openai as wire, responses


class Events(Protocol):
    def more(self, sent: int, n: int) -> bytes: ...

    def end(self, sent: int, n: int, reason: str) -> bytes: ...


class ResponseEvents:
    """One streamed Response: `response.created` ... a `response.output_text.delta` per token ...
    `response.completed` (`response.incomplete` when cut at `max_output_tokens`)."""

    def __init__(self, rid: str, model: str, created: int, prompt_tokens: int, max_tokens: int | None) -> None:
        self.rid, self.model, self.created = rid, model, created
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.seq = 0
        self.item = f"msg_{rid}"
        self._delta = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"'
                       + self.item.encode() + b'","output_index":0,"content_index":0,"delta":'
                       + orjson.dumps(TOKEN_TEXT) + b',"logprobs":[],"sequence_number":%d}\n\n')

    def _event(self, name: str, **fields: object) -> bytes:
        self.seq += 1
        return responses.event(name, {"type": name, **fields, "sequence_number": self.seq - 1})

    def _response(self, text: str | None, status: str, output_tokens: int = 0) -> dict[str, object]:
        return responses.response(self.rid, self.model, self.created, text, status, self.prompt_tokens,
                                  output_tokens, self.max_tokens)

    def _open(self) -> bytes:
        part = {"type": "output_text", "text": "", "annotations": []}
        return b"".join((
            self._event("response.created", response=self._response(None, "in_progress")),
            self._event("response.in_progress", response=self._response(None, "in_progress")),
            self._event("response.output_item.added", output_index=0,
                        item={"id": self.item, "type": "message", "role": "assistant", "status": "in_progress",
                              "content": []}),
            self._event("response.content_part.added", item_id=self.item, output_index=0, content_index=0, part=part),
        ))

    def _deltas(self, n: int) -> bytes:
        out = b"".join(self._delta % (self.seq + i) for i in range(n))
        self.seq += n
        return out

    def more(self, sent: int, n: int) -> bytes:
        return (self._open() if sent == 0 and n > 0 else b"") + self._deltas(n)

    def end(self, sent: int, n: int, reason: str) -> bytes:
        total = sent + n
        text = TOKEN_TEXT * total
        status = "incomplete" if reason == "length" and self.max_tokens is not None else "completed"
        done = "response.incomplete" if status == "incomplete" else "response.completed"
        return b"".join((
            self.more(sent, n) if n or sent else self._open(),
            self._event("response.output_text.done", item_id=self.item, output_index=0, content_index=0, text=text,
                        logprobs=[]),
            self._event("response.content_part.done", item_id=self.item, output_index=0, content_index=0,
                        part={"type": "output_text", "text": text, "annotations": []}),
            self._event("response.output_item.done", output_index=0, item=responses.message_item(self.rid, text,
                                                                                                "completed")),
            self._event(done, response=self._response(text, status, total)),
        ))


class MessageEvents:
    """One streamed Anthropic message: `message_start`, a text block of a `content_block_delta`
    per token, `message_delta` with the stop reason and output tokens, `message_stop`."""

    def __init__(self, rid: str, model: str, prompt_tokens: int) -> None:
        self.rid, self.model, self.prompt_tokens = rid, model, prompt_tokens
        self._delta = anthropic.event("content_block_delta", {
            "type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TOKEN_TEXT}})

    def _open(self) -> bytes:
        return (anthropic.event("message_start", {"type": "message_start", "message": anthropic.message(
                    self.rid, self.model, "", None, self.prompt_tokens, 1)})
                + anthropic.event("content_block_start", {"type": "content_block_start", "index": 0,
                                                          "content_block": {"type": "text", "text": ""}}))

    def more(self, sent: int, n: int) -> bytes:
        return (self._open() if sent == 0 and n > 0 else b"") + self._delta * n

    def end(self, sent: int, n: int, reason: str) -> bytes:
        return b"".join((
            self.more(sent, n) if n or sent else self._open(),
            anthropic.event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            anthropic.event("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": anthropic.stop_reason(reason),
                                                        "stop_sequence": None},
                                              "usage": {"output_tokens": sent + n}}),
            anthropic.event("message_stop", {"type": "message_stop"}),
        ))


def chunks_for(endpoint: wire.Endpoint, rid: str, model: str, created: int, *, prompt_tokens: int,
               include_usage: bool, max_tokens: int | None, prompt_ids: list[int] | None = None) -> Events:
    """The events of a streamed answer on `endpoint`."""
    if endpoint == "responses":
        return ResponseEvents(rid, model, created, prompt_tokens, max_tokens)
    if endpoint == "messages":
        return MessageEvents(rid, model, prompt_tokens)
    return Chunks(endpoint, rid, model, created, prompt_tokens=prompt_tokens, include_usage=include_usage,
                  prompt_ids=prompt_ids)


def body_for(endpoint: wire.Endpoint, rid: str, model: str, created: int, *, prompt_tokens: int,
             output_tokens: int, finish_reason: str, max_tokens: int | None) -> bytes:
    """The JSON body of a whole answer on `endpoint`."""
    text = TOKEN_TEXT * output_tokens
    if endpoint == "responses":
        status = "incomplete" if finish_reason == "length" and max_tokens is not None else "completed"
        return orjson.dumps(responses.response(rid, model, created, text, status, prompt_tokens, output_tokens,
                                               max_tokens))
    if endpoint == "messages":
        return orjson.dumps(anthropic.message(rid, model, text, anthropic.stop_reason(finish_reason), prompt_tokens,
                                              output_tokens))
    return response_body(endpoint, rid, model, created, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                         finish_reason=finish_reason)
