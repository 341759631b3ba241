"""What counts as content, what a request asks for, and a non-stream answer joined from chunks."""

from __future__ import annotations

import json

from tailguard.client.assembly import Assembler, streaming_body
from tailguard.client.chunks import RequestFields, StreamScan, request_fields


def sse(*objs: object) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def delta(**d: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def test_only_content_counts() -> None:
    scan = StreamScan()
    assert scan.feed(b": keep-alive\n\n: keep-alive\n\n") == 0
    assert scan.feed(sse(delta(role="assistant", content=""), delta(content=None), {"choices": []})) == 0
    assert scan.feed(sse(delta(content="hi"), delta(reasoning_content="hmm"),
                         delta(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]))) == 3
    assert scan.feed(b'data: {"choices": [{"index": 0, "text": "x"}]}') == 0  # not complete yet
    assert scan.feed(b"\n\n") == 1
    assert scan.tokens() == 4
    scan.feed(sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}))
    assert scan.tokens() == 9


def test_request_fields() -> None:
    body = json.dumps({"model": "m", "messages": [], "stream": True, "max_tokens": 64}).encode()
    assert request_fields("POST", "/v1/chat/completions", body) == RequestFields("chat", True, 64)
    body = json.dumps({"model": "m", "prompt": "x", "max_completion_tokens": 8, "max_tokens": 99}).encode()
    assert request_fields("POST", "/v1/completions", body) == RequestFields("completions", False, 8)
    assert request_fields("POST", "/v1/completions", body).assembles
    assert request_fields("GET", "/v1/models", b"") == RequestFields(None, False, None)
    assert request_fields("POST", "/v1/chat/completions", b"{oops") == RequestFields(None, False, None)
    body = json.dumps({"messages": [], "max_tokens": True}).encode()
    assert request_fields("POST", "/v1/chat/completions", body).max_tokens is None


def test_streaming_body_keeps_the_request_and_asks_for_usage() -> None:
    body = json.dumps({"model": "m", "messages": [], "stream_options": {"x": 1}, "seed": 3}).encode()
    assert json.loads(streaming_body(body)) == {"model": "m", "messages": [], "seed": 3, "stream": True,
                                                "stream_options": {"x": 1, "include_usage": True}}


def test_assembled_chat_answer() -> None:
    asm = Assembler(chat=True)
    raw = sse({"id": "c9", "created": 5, "model": "m", **delta(role="assistant", content="")},
              delta(content="Hel"), delta(content="lo"),
              delta(tool_calls=[{"index": 0, "id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}]),
              delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
              {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}})
    for i in range(0, len(raw), 7):  # fed in pieces, as a socket delivers it
        asm.feed(raw[i:i + 7])
    body = json.loads(asm.finish())
    assert body["id"] == "c9" and body["object"] == "chat.completion" and body["model"] == "m"
    msg = body["choices"][0]["message"]
    assert msg["content"] == "Hello" and msg["role"] == "assistant"
    assert msg["tool_calls"] == [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"]["completion_tokens"] == 4


def test_assembled_completions_answer() -> None:
    asm = Assembler(chat=False)
    asm.feed(sse({"id": "x", "choices": [{"index": 0, "text": "a"}]},
                 {"choices": [{"index": 1, "text": "b"}]},
                 {"choices": [{"index": 0, "text": "c", "finish_reason": "length"}]}))
    body = json.loads(asm.finish())
    assert body["object"] == "text_completion"
    # A choice the stream never said the end of stopped, as the gateway answers (it was None here).
    assert [(c["text"], c["finish_reason"]) for c in body["choices"]] == [("ac", "length"), ("b", "stop")]


def test_assembled_answer_keeps_reasoning_logprobs_and_the_finish_reason() -> None:
    # What the client dropped before it joined with the gateway's joiner (`wire.join`).
    token = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}
    asm = Assembler(chat=True)
    asm.feed(sse({"id": "c1", "system_fingerprint": "fp", **delta(role="assistant", content="")},
                 delta(reasoning="think"), delta(reasoning_content="think"),
                 {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [token]},
                               "finish_reason": None}]},
                 {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                 ).removesuffix(b"\ndata: [DONE]\n\n"))  # the last chunk cut off by EOF before its blank line
    body = json.loads(asm.finish())
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hi", "reasoning_content": "think",
                                 "reasoning": "think"}
    assert choice["logprobs"] == {"content": [token]}
    assert choice["finish_reason"] == "length"
    assert body["system_fingerprint"] == "fp"
