"""Where the text is, route by route, and a body copied with its texts replaced."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.guards.texts import answer_texts, chunk_texts, leaves, replaced, set_answer_text

BODIES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("chat, string content", {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                                          {"role": "user", "content": "hi"}]}, ["be brief", "hi"]),
    ("chat, content parts", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     ["look"]),
    ("completions, a prompt and a list", {"prompt": ["one", "two"], "suffix": "not read"}, ["one", "two"]),
    ("completions, token ids", {"prompt": [1, 2, 3]}, []),
    ("responses, input items", {"instructions": "as a pirate", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ahoy"}]},
        {"type": "function_call_output", "call_id": "c1", "output": "42"}]}, ["as a pirate", "ahoy", "42"]),
    ("messages, system blocks and a tool result", {"system": [{"type": "text", "text": "rules"}], "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "result"}]}]}]}, ["rules", "result"]),
    ("embeddings", {"model": "e", "input": ["a", "b"]}, ["a", "b"]),
]


@pytest.mark.parametrize("what,body,texts", BODIES, ids=[b[0] for b in BODIES])
def test_the_texts_of_each_route(what: str, body: dict[str, Any], texts: list[str]) -> None:
    assert [t for _, t in leaves(body)] == texts


def test_replaced_copies_along_the_paths_only() -> None:
    body = {"model": "m", "tools": [{"type": "function"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}, {"role": "user", "content": "b"}]}
    (path_a, _), (path_b, _) = leaves(body)
    out = replaced(body, {path_a: "A"})
    assert out["messages"][0]["content"][0]["text"] == "A" and body["messages"][0]["content"][0]["text"] == "a"
    assert out["messages"][1] is body["messages"][1] and out["tools"] is body["tools"]  # shared, not copied
    assert path_b == ("messages", 1, "content")


def test_a_deep_body_is_read_to_a_bound() -> None:
    node: Any = "deep"
    for _ in range(50):
        node = [{"content": node}]
    assert leaves({"messages": node}) == []


def test_answers_and_chunks() -> None:
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"},
                          {"index": 1, "message": {"role": "assistant", "content": "y"}, "finish_reason": "stop"}]}
    assert answer_texts(answer) == [(0, "x"), (1, "y")]
    set_answer_text(answer, 1, "", "content_filter")
    assert answer["choices"][1] == {"index": 1, "message": {"role": "assistant", "content": ""},
                                    "finish_reason": "content_filter"}
    assert chunk_texts({"choices": [{"index": 2, "delta": {"content": "z"}}]}) == [(2, "z")]
    assert chunk_texts({"choices": [{"index": 0, "text": "t"}]}) == [(0, "t")]
    assert chunk_texts({"choices": [], "usage": {"completion_tokens": 3}}) == []
