"""The simulator's answer bytes on plain numbers: the SSE events of a stream written in pieces,
and the JSON body of a whole answer."""

from __future__ import annotations

import orjson

from tailguard.sim.answer import TOKEN_TEXT, Chunks, response_body
from tailguard.wire.sse import SSEDecoder


def events(*writes: bytes) -> list[object]:
    """The JSON of each event the writes make up, "[DONE]" as the string."""
    out: list[object] = []
    for ev in SSEDecoder().feed(b"".join(writes)):
        out.append("[DONE]" if ev.data == b"[DONE]" else orjson.loads(ev.data))
    return out


def test_a_chat_stream_opens_with_the_role_and_ends_with_usage_and_done() -> None:
    c = Chunks("chat", "r1", "m", 7, prompt_tokens=12, include_usage=True)
    got = events(c.more(sent=0, n=2), c.more(sent=2, n=1), c.end(sent=3, n=2, reason="length"))
    deltas = [e["choices"][0]["delta"] for e in got[:-2]]  # type: ignore[index]
    assert deltas == [{"role": "assistant", "content": ""}] + [{"content": TOKEN_TEXT}] * 5
    assert [e["choices"][0]["finish_reason"] for e in got[:-2]] == [None] * 5 + ["length"]  # type: ignore[index]
    assert got[-2]["choices"] == [] and got[-2]["usage"] == {  # type: ignore[index]
        "prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    assert got[-1] == "[DONE]"
    assert all(e["id"] == "r1" and e["created"] == 7 for e in got[:-1])  # type: ignore[index]


def test_a_stream_done_at_once_still_opens_with_the_role() -> None:
    c = Chunks("chat", "r1", "m", 7, prompt_tokens=1, include_usage=False)
    got = events(c.end(sent=0, n=1, reason="stop"))
    assert [e["choices"][0]["delta"] for e in got[:-1]] == [  # type: ignore[index]
        {"role": "assistant", "content": ""}, {"content": TOKEN_TEXT}]
    assert got[-1] == "[DONE]"


def test_an_end_with_no_new_token_carries_only_the_finish_reason() -> None:
    c = Chunks("chat", "r1", "m", 7, prompt_tokens=1, include_usage=False)
    got = events(c.end(sent=4, n=0, reason="stop"))
    assert got[0]["choices"][0]["delta"] == {} and got[0]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    assert got[1:] == ["[DONE]"]
    assert c.more(sent=4, n=0) == b""


def test_a_completions_stream_has_no_role_chunk() -> None:
    c = Chunks("completions", "r2", "m", 7, prompt_tokens=3, include_usage=True)
    got = events(c.more(sent=0, n=2), c.end(sent=2, n=1, reason="length"))
    texts = [e["choices"][0]["text"] for e in got[:-2]]  # type: ignore[index]
    assert texts == [TOKEN_TEXT] * 3
    assert got[-2]["usage"]["completion_tokens"] == 3 and got[-1] == "[DONE]"  # type: ignore[index]


def test_the_whole_body_holds_every_token_and_the_usage() -> None:
    chat = orjson.loads(response_body("chat", "r3", "m", 7, prompt_tokens=4, output_tokens=3, finish_reason="stop"))
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["content"] == TOKEN_TEXT * 3
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    text = orjson.loads(response_body("completions", "r4", "m", 7, prompt_tokens=4, output_tokens=2,
                                      finish_reason="length"))
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == TOKEN_TEXT * 2
