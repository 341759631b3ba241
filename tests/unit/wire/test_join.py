"""The stream-to-body joiner the gateway and the client share: everything a stream carried is in
the body, fed chunk by chunk as literal dicts."""

from __future__ import annotations

from typing import Any

from tailguard.wire.join import ChunkJoiner


def joined(chat: bool, *chunks: dict[str, Any]) -> dict[str, Any]:
    joiner = ChunkJoiner(chat)
    for chunk in chunks:
        joiner.feed(chunk)
    return joiner.finish()


def delta(index: int = 0, finish_reason: str | None = None, logprobs: Any = None, **d: Any) -> dict[str, Any]:
    return {"choices": [{"index": index, "delta": d, "logprobs": logprobs, "finish_reason": finish_reason}]}


def lp(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def test_a_chat_answer_keeps_text_reasoning_logprobs_finish_reason_and_the_head() -> None:
    body = joined(
        True,
        {"id": "c1", "created": 7, "model": "m", "system_fingerprint": "fp", "service_tier": "default",
         **delta(role="assistant", content="")},
        delta(reasoning_content="Let me "),
        delta(reasoning_content="think."),
        {"id": "c1", "created": 8, "model": "other", **delta(content="Hel", logprobs={"content": [lp("Hel", -0.5)]})},
        delta(content="lo", logprobs={"content": [lp("lo", -0.25)], "refusal": None}),
        delta(finish_reason="length"),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
    )
    assert body == {
        "id": "c1", "object": "chat.completion", "created": 7, "model": "m",  # the first value sent
        "system_fingerprint": "fp", "service_tier": "default",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "reasoning_content": "Let me think."},
            "logprobs": {"content": [lp("Hel", -0.5), lp("lo", -0.25)]},
            "finish_reason": "length",
        }],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def test_each_reasoning_key_is_joined_on_its_own() -> None:
    # Newer vLLM says `reasoning`; a server that sends both (an alias) must not get the text twice.
    msg = joined(True, delta(reasoning="a", reasoning_content="a"), delta(reasoning="b", reasoning_content="b"),
                 delta(content="x"))["choices"][0]["message"]
    assert (msg["reasoning"], msg["reasoning_content"], msg["content"]) == ("ab", "ab", "x")
    assert "reasoning" not in joined(True, delta(reasoning_content="r"))["choices"][0]["message"]


def test_tool_call_deltas_are_joined_by_their_index_and_the_content_is_null() -> None:
    call = {"index": 0, "id": "t1", "type": "function", "function": {"name": "get_", "arguments": '{"a"'}}
    body = joined(
        True,
        delta(role="assistant"),
        delta(tool_calls=[call, {"index": 1, "id": "t2", "function": {"name": "g", "arguments": ""}}]),
        delta(tool_calls=[{"index": 0, "function": {"name": "weather", "arguments": ": 1}"}}]),
        delta(tool_calls=[{"index": 1, "function": {"arguments": "{}"}}], finish_reason="tool_calls"),
    )
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"a": 1}'}},
        {"id": "t2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]}
    assert choice["finish_reason"] == "tool_calls"


def test_choices_are_joined_by_index_and_a_stream_that_never_says_how_it_ended_stopped() -> None:
    body = joined(
        False,
        {"id": "x", "choices": [{"index": 1, "text": "b"}, {"index": 0, "text": "a"}]},
        {"choices": [{"index": 0, "text": "c", "finish_reason": "length", "stop_reason": None}]},
        {"choices": [{"index": 1, "text": "d", "finish_reason": "stop", "stop_reason": 128001}]},
    )
    assert body["object"] == "text_completion"
    assert [(c["index"], c["text"], c["finish_reason"], c["stop_reason"]) for c in body["choices"]] == [
        (0, "ac", "length", None), (1, "bd", "stop", 128001)]
    assert joined(False, {"choices": [{"index": 0, "text": "a"}]})["choices"][0]["finish_reason"] == "stop"
    assert "stop_reason" not in joined(True, delta(content="a"))["choices"][0]


def test_completions_logprobs_are_each_list_joined() -> None:
    def chunk(text: str, logprob: float, offset: int) -> dict[str, Any]:
        return {"choices": [{"index": 0, "text": text, "logprobs": {
            "tokens": [text], "token_logprobs": [logprob], "top_logprobs": [{text: logprob}], "text_offset": [offset]}}]}
    [choice] = joined(False, chunk("a", -1.0, 0), chunk("b", -2.0, 1))["choices"]
    assert choice["logprobs"] == {"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0],
                                  "top_logprobs": [{"a": -1.0}, {"b": -2.0}], "text_offset": [0, 1]}


def test_a_refusal_is_kept_and_a_null_one_is_not() -> None:
    msg = joined(True, delta(content=None, refusal="I can"), delta(refusal="not."))["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "", "refusal": "I cannot."}
    assert "refusal" not in joined(True, delta(content="ok", refusal=None))["choices"][0]["message"]


def test_an_error_chunk_is_kept_apart_and_not_joined() -> None:
    joiner = ChunkJoiner(chat=True)
    joiner.feed(delta(content="par"))
    joiner.feed({"error": {"message": "engine died", "type": "server_error"}})
    assert joiner.error == {"message": "engine died", "type": "server_error"}
    assert joiner.finish()["choices"][0]["message"]["content"] == "par"


def test_what_a_stream_did_not_send_gets_the_defaults_openai_bodies_have() -> None:
    assert joined(True) == {"id": "", "object": "chat.completion", "created": 0, "model": "", "choices": [],
                            "usage": None}
    # A null sent first gives way to a value sent later; a field sent only as null stays null.
    body = joined(True, {"id": None, "system_fingerprint": None, **delta(content="a")},
                  {"id": "late", "system_fingerprint": None, **delta(content="b")})
    assert (body["id"], body["system_fingerprint"]) == ("late", None)


def test_the_text_is_every_choices_answer_and_finish_leaves_the_joiner_as_it_was() -> None:
    joiner = ChunkJoiner(chat=True)
    joiner.feed({"choices": [{"index": 1, "delta": {"content": "B"}}, {"index": 0, "delta": {"content": "A"}}]})
    joiner.feed(delta(reasoning="not the answer"))
    assert joiner.text() == "AB"
    first = joiner.finish()
    joiner.feed(delta(content="a"))
    assert first["choices"][0]["message"]["content"] == "A"
    assert joiner.finish()["choices"][0]["message"]["content"] == "Aa"


def test_chunks_that_are_not_what_they_should_be_are_passed_over() -> None:
    body = joined(True, {"choices": None}, {"choices": ["x", {"index": "1", "delta": "no"}]},
                  {"choices": [{"index": True, "delta": {"content": 5, "tool_calls": ["x"]}}]}, delta(content="ok"))
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, "ok")]
