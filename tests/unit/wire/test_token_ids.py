"""vLLM's token-id fields cut from the bytes a client gets, and a completions chunk in chat's shape."""

from __future__ import annotations

import orjson
import pytest

from tailguard.wire.token_ids import as_chat_chunk, generated_ids, prompt_ids, shows_text, without_token_ids


@pytest.mark.parametrize("event, clean", [
    (b'data: {"id":"a","choices":[{"index":0,"delta":{"content":"x"},"token_ids":[5,6]}]}\n\n',
     b'data: {"id":"a","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'),
    (b'data: {"id":"a","choices":[{"token_ids":[5],"index":0}],"prompt_token_ids":[1,2,3]}\n\n',
     b'data: {"id":"a","choices":[{"index":0}]}\n\n'),
    (b'data: {"choices":[{"text":"x","prompt_token_ids":null,"token_ids": [5]}]}\n\n',
     b'data: {"choices":[{"text":"x"}]}\n\n'),
    (b'data: {"choices":[{"text":"x"}]}\n\ndata: {"choices":[{"text":"y","token_ids":[1]}]}\n\n',
     b'data: {"choices":[{"text":"x"}]}\n\ndata: {"choices":[{"text":"y"}]}\n\n'),
])
def test_the_ids_are_cut_and_the_json_stays_whole(event: bytes, clean: bytes) -> None:
    assert without_token_ids(event) == clean
    orjson.loads(clean.split(b"\n\n")[-2].removeprefix(b"data: "))


def test_bytes_without_ids_are_returned_as_they_are() -> None:
    event = b'data: {"choices":[{"delta":{"content":"the word token_ids\\": [1]"}}]}\n\n'
    assert without_token_ids(b'data: {"choices":[]}\n\n') == b'data: {"choices":[]}\n\n'
    assert without_token_ids(event) == event


def test_ids_read_from_either_place_vllm_puts_them() -> None:
    chat = {"prompt_token_ids": [1, 2], "choices": [{"delta": {"content": ""}, "token_ids": [3]}]}
    completion = {"choices": [{"text": "a", "prompt_token_ids": [1, 2], "token_ids": [3, 4]}]}
    assert (prompt_ids(chat), generated_ids(chat), shows_text(chat)) == ([1, 2], [3], False)
    assert (prompt_ids(completion), generated_ids(completion), shows_text(completion)) == ([1, 2], [3, 4], True)
    assert prompt_ids({"choices": []}) is None and generated_ids({"choices": [{"token_ids": [True]}]}) is None


def test_a_completion_chunk_in_chat_shape() -> None:
    out = as_chat_chunk({"id": "c", "object": "text_completion",
                         "choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": None})
    assert out == {"id": "c", "object": "chat.completion.chunk", "usage": None,
                   "choices": [{"index": 0, "finish_reason": "length", "delta": {}, "logprobs": None}]}
