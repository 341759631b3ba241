"""The Responses, Messages and pooling routes on the wire: what the gateway reads of a body, what
each stream's events carry (found by their bytes), and each route's usage."""

from __future__ import annotations

import orjson
import pytest

from tailguard.errors import APIError, BadRequest
from tailguard.sim.typed import MessageEvents, ResponseEvents
from tailguard.wire import anthropic, embeddings, responses
from tailguard.wire.chunks import Usage
from tailguard.wire.framing import FRAMINGS, Framing
from tailguard.wire.openai import parse_request
from tailguard.wire.sse import SSEDecoder


def _read(framing: Framing, stream: bytes) -> tuple[int, Usage, bool, bool]:
    """Content events, usage, whether the last event came, whether an error did."""
    usage, content, last, error = Usage(), 0, False, False
    for ev in SSEDecoder().feed(stream):
        d = ev.data
        if framing.has_content(d, 0, len(d)):
            content += 1
        elif framing.has_usage(d, 0, len(d)):
            framing.read_usage(usage, orjson.loads(d))
        error = error or framing.is_error(d, 0, len(d))
        last = last or framing.is_last(d, 0, len(d))
    return content, usage, last, error


def test_a_responses_stream_is_read_by_its_typed_events() -> None:
    ev = ResponseEvents("r1", "m", 0, prompt_tokens=12, max_tokens=5)
    stream = ev.more(0, 2) + ev.end(2, 3, "length")
    content, usage, last, error = _read(FRAMINGS["responses"], stream)
    # the output_text.done / content_part.done / completed events carry the whole text: not content
    assert (content, usage.prompt_tokens, usage.completion_tokens, last, error) == (5, 12, 5, True, False)
    assert b"response.incomplete" in stream  # cut at max_output_tokens
    seqs = [orjson.loads(e.data)["sequence_number"] for e in SSEDecoder().feed(stream)]
    assert seqs == list(range(len(seqs)))


def test_a_messages_stream_is_read_by_its_typed_events() -> None:
    ev = MessageEvents("m1", "m", prompt_tokens=9)
    stream = ev.more(0, 1) + ev.end(1, 3, "stop")
    content, usage, last, error = _read(FRAMINGS["messages"], stream)
    assert (content, usage.prompt_tokens, usage.completion_tokens, last, error) == (4, 9, 4, True, False)
    assert b'"stop_reason":"end_turn"' in stream


def test_error_events_in_each_routes_shape() -> None:
    err = APIError("boom", status=502, code="disconnect")
    assert FRAMINGS["responses"].is_error(*_whole(responses.error_event(err)))
    body = orjson.loads(anthropic.error_event(err).split(b"data: ")[1])
    assert body == {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert orjson.loads(anthropic.error_body(BadRequest("no")))["error"]["type"] == "invalid_request_error"


def _whole(event: bytes) -> tuple[bytes, int, int]:
    data = SSEDecoder().feed(event)[0].data
    return data, 0, len(data)


def test_the_bodies_the_gateway_reads() -> None:
    p = parse_request(orjson.dumps({"model": "m", "input": "abcdefgh", "instructions": "abcd",
                                    "max_output_tokens": 7, "stream": True}), "responses")
    assert (p.prompt_tokens, p.max_tokens, p.stream) == (1 + 4 + 2, 7, True)
    m = parse_request(orjson.dumps({"model": "m", "max_tokens": 3, "system": [{"type": "text", "text": "abcd"}],
                                    "messages": [{"role": "user", "content": [{"type": "text", "text": "ab"}]}]}),
                      "messages")
    assert (m.prompt_tokens, m.max_tokens, m.stream) == (1 + 4 + 1, 3, False)
    e = parse_request(orjson.dumps({"input": [[1, 2, 3], [4]]}), "embeddings")
    assert (e.prompt_tokens, e.max_tokens, e.stream) == (4, None, False)
    # A cross-encoder reads the query with each document: the job is every pair.
    assert embeddings.input_tokens({"query": "abcd", "documents": ["abcd", "abcdefgh"]}) == (1 + 1) + (1 + 2)
    assert embeddings.input_tokens({"text_1": ["abcd"], "text_2": ["a", "b", "c"]}) == 3 * (1 + 1)
    assert embeddings.input_tokens({"text_1": ["a", "b"], "text_2": ["c", "d"]}) == 4  # pairwise: each text once
    for body, endpoint, param in (({"input": 3}, "responses", "input"), ({"messages": []}, "messages", "messages"),
                                  ({"messages": [{"role": "user", "content": "x"}]}, "messages", "max_tokens"),
                                  ({"input": []}, "embeddings", "input"),
                                  ({"input": "x", "max_output_tokens": 0}, "responses", "max_output_tokens")):
        with pytest.raises(BadRequest) as info:
            parse_request(orjson.dumps(body), endpoint)  # type: ignore[arg-type]
        assert info.value.param == param


def test_whole_answers_usage() -> None:
    u = Usage()
    embeddings.read_usage(u, {"usage": {"prompt_tokens": 11, "total_tokens": 11}})
    assert (u.prompt_tokens, u.completion_tokens) == (11, 0)
    u = Usage()
    anthropic.read_usage(u, {"type": "message", "usage": {"input_tokens": 3, "output_tokens": 8}})
    assert (u.prompt_tokens, u.completion_tokens) == (3, 8)
    # Anthropic's input_tokens leaves the cached part out (llama-server's answer to a repeated prompt).
    u = Usage()
    anthropic.read_usage(u, {"type": "message_start", "message": {"usage": {
        "input_tokens": 1, "cache_read_input_tokens": 53, "cache_creation_input_tokens": None, "output_tokens": 0}}})
    assert (u.prompt_tokens, u.completion_tokens) == (54, None)  # output comes with message_delta
    u = Usage()
    responses.read_usage(u, {"object": "response", "usage": {"input_tokens": 2, "output_tokens": 5}})
    assert (u.prompt_tokens, u.completion_tokens) == (2, 5)
