"""Continuation bodies of a suspended generation: what the engine is asked to continue."""

from __future__ import annotations

from tailguard.front.intake import resumable
from tailguard.gateway.upstream.resume import Transcript, continuation_body
from tailguard.wire.openai import chat_chunk, usage_dict
from tailguard.wire.sse import encode_event


def _tok(text: str, cid: str, running: int | None = None) -> bytes:
    usage = None if running is None else usage_dict(9, running)
    return encode_event(chat_chunk(cid, "m", 1, content=text, usage=usage))


def test_chat_continuation_appends_the_text_and_shrinks_the_budget() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100,
            "max_completion_tokens": 90, "min_tokens": 5}
    transcript = Transcript(parts=["Once", " upon", " a"], tokens=3)
    out, _ = continuation_body(body, "chat", transcript)
    assert out["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon a"}]
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert (out["max_tokens"], out["max_completion_tokens"], out["min_tokens"]) == (97, 87, 2)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 100  # untouched
    assert (transcript.runs, transcript.base_tokens, transcript.added_prompt_tokens) == (2, 3, 4 + 3)  # 11 bytes -> 3 tokens
    # The client sees its own prompt and every token: upstream counted 7 more prompt tokens.
    assert transcript.client_usage(19, 97) == (12, 100)


def test_a_prompt_the_first_run_counted_is_the_one_the_client_sees() -> None:
    """Where the engine puts a running usage on every chunk (vLLM), the client's prompt count is
    the first run's, exact, not the continuation's less an estimate of what it added."""
    transcript = Transcript()
    transcript.add("Once", 1, 17)
    transcript.add(" upon", 2, 17)
    continuation_body({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}, "chat", transcript)
    transcript.add(" a", 1, 30)  # the continuation's prompt: not the client's
    assert transcript.client_usage(30, 8) == (17, 10)


def test_completion_continuation_and_a_client_continuing_its_own_message() -> None:
    transcript = Transcript(parts=["abcd"], tokens=1)
    out, _ = continuation_body({"prompt": "x" * 8, "max_tokens": 10}, "completions", transcript)
    assert (out["prompt"], out["max_tokens"], transcript.added_prompt_tokens) == ("x" * 8 + "abcd", 9, 1)
    own = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The"}],
           "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 4}
    assert resumable(own, "chat")
    out, _ = continuation_body(own, "chat", Transcript(parts=[" end"], tokens=1))
    assert out["messages"][-1] == {"role": "assistant", "content": "The end"} and out["max_tokens"] == 3


def test_nothing_generated_yet_restarts_the_same_body() -> None:
    body = {"prompt": "p", "max_tokens": 10}
    transcript = Transcript()
    assert continuation_body(body, "completions", transcript) == (body, "completions")
    assert transcript.runs == 2 and transcript.client_usage(1, 10) == (1, 10)


def test_a_lazy_stream_keeps_its_chunks_raw_until_it_must_be_continued() -> None:
    """A stream that may only be moved is relayed unparsed: its blocks of content events are
    kept as they came (a block may hold several, and a usage-only event), parsed when the
    continuation needs its text, with the first run's id and the engine's running count."""
    transcript = Transcript(lazy=True)
    transcript.keep(_tok("Once", "x1"), chat=True)  # the first is parsed: its id
    transcript.keep(_tok(" upon", "x1") + _tok(" a", "x1", running=4), chat=True)  # vLLM packed two tokens in one
    assert (transcript.text(), transcript.tokens, transcript.first_id) == ("Once", 1, "x1")  # the block waits, raw
    out, _ = continuation_body({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}, "chat", transcript)
    assert out["messages"][-1] == {"role": "assistant", "content": "Once upon a"} and out["max_tokens"] == 6
    assert (transcript.tokens, transcript.first_id, transcript.prompt_tokens, transcript.lazy, transcript.raw) == (4, "x1", 9, False, [])


def test_a_lazy_stream_reads_compact_chunks_by_their_bytes_and_keeps_the_rest_in_order() -> None:
    """The usual chunk's text is taken without a parse; one with an escape waits raw (at most a
    bounded number of blocks), and the text comes out in the order the client got it."""
    transcript = Transcript(lazy=True)
    texts = [f'{i} "q" ' if i % 3 == 0 else f"{i} " for i in range(600)]
    for i, t in enumerate(texts):
        transcript.keep(_tok(t, "x"), chat=True)
        assert len(transcript.raw) < 256
        if i % 3 == 1:
            assert not transcript.raw  # a compact chunk read by its bytes, after what waited before it
    transcript.decode(chat=True)
    assert transcript.tokens == 600 and transcript.text() == "".join(texts)


def _ids_chunk(text: str, ids: list[int], prompt: list[int] | None = None) -> dict[str, object]:
    """A vLLM chat chunk with `return_token_ids`: its tokens' ids, the prompt's on the first."""
    obj: dict[str, object] = {"id": "x1", "object": "chat.completion.chunk",
                              "choices": [{"index": 0, "delta": {"content": text}, "token_ids": ids}]}
    if prompt is not None:
        obj["prompt_token_ids"] = prompt
    return obj


def _tracked(*chunks: dict[str, object]) -> Transcript:
    """A run on an engine that returns token ids, the client not asking for them: every chunk's
    text passed to the client, as the relay does."""
    transcript = Transcript()
    transcript.run_on(gives_ids=True, client_ids=False)
    for c in chunks:
        transcript.absorb(c)
        text = c["choices"][0]["delta"]["content"]  # type: ignore[index]
        if text:
            transcript.add(text, None)
    return transcript


def test_a_chat_stream_is_continued_by_its_token_ids_on_completions_in_chat_shape() -> None:
    """Nothing re-tokenised: the prompt's ids and every generated id are the next prompt, the
    budget shrinks by what was generated, the sampling is kept and the chat fields go; the
    run's completions chunks come back to the client as chat chunks."""
    transcript = _tracked(_ids_chunk("Once", [7, 8], prompt=[1, 2, 3]), _ids_chunk(" upon", [9]))
    assert transcript.hide_ids and transcript.by_ids()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10,
            "temperature": 0.3, "seed": 4, "continue_final_message": False}
    out, endpoint = continuation_body(body, "chat", transcript, by_ids=True)
    assert endpoint == "completions"
    assert out == {"model": "m", "prompt": [1, 2, 3, 7, 8, 9], "max_tokens": 7, "temperature": 0.3, "seed": 4,
                   "return_token_ids": True}
    assert (transcript.tokens, transcript.added_prompt_tokens, transcript.as_chat) == (3, 3, True)
    chunk = transcript.absorb({"id": "cmpl-2", "object": "text_completion",
                         "choices": [{"index": 0, "text": " a", "token_ids": [10], "finish_reason": None}]})
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"] == [{"index": 0, "token_ids": [10], "finish_reason": None, "delta": {"content": " a"},
                                 "logprobs": None}]
    assert transcript.ids == [7, 8, 9, 10] and transcript.client_usage(3 + 3 + 0, 1) == (3, 4)


def test_ids_whose_text_the_engine_held_back_are_generated_again_not_sent() -> None:
    """An engine holds back a token's text while it may be half a character: the ids after the
    last text the client has are left out of the continuation and counted again when redone."""
    transcript = _tracked(_ids_chunk("Once", [7], prompt=[1]), _ids_chunk("", [8]))
    transcript.tokens = 2  # the engine's running count: the held token was generated
    out, _ = continuation_body({"model": "m", "prompt": "p", "max_tokens": 5}, "completions", transcript, by_ids=True)
    assert out["prompt"] == [1, 7] and out["max_tokens"] == 4 and transcript.tokens == 1 and not transcript.as_chat


def test_by_text_where_an_id_is_missing_or_a_stop_string_may_hold_text_back() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    no_ids = Transcript(parts=["Once"], tokens=1)
    no_ids.run_on(gives_ids=False, client_ids=False)
    assert continuation_body(chat, "chat", no_ids, by_ids=True)[1] == "chat"  # its first run gave none
    moved = _tracked(_ids_chunk("Once", [7], prompt=[1]))
    moved.run_on(gives_ids=False, client_ids=False)  # a run on an engine without ids: no longer whole
    assert not moved.by_ids() and not moved.hide_ids
    stops = _tracked(_ids_chunk("Once", [7], prompt=[1]))
    assert continuation_body({**chat, "stop": ["\n"]}, "chat", stops, by_ids=True)[1] == "chat"
    asked = Transcript()
    asked.run_on(gives_ids=True, client_ids=True)  # the client asked for the ids: it sees them
    assert not asked.hide_ids and asked.ids == []


def test_a_lazy_stream_reads_each_chunks_ids_by_its_bytes_in_order() -> None:
    """Unparsed, as the relay's fast path passes them: the ids of compact chunks read by their
    bytes, any other block kept raw and parsed in order, the ids in the order of the text."""
    transcript = Transcript(lazy=True)
    transcript.run_on(gives_ids=True, client_ids=False)
    first = encode_event(b'{"id":"x1","choices":[{"delta":{"role":"assistant","content":""}}],"prompt_token_ids":[1,2]}')
    transcript.keep(first + encode_event(b'{"id":"x1","choices":[{"delta":{"content":"a"},"token_ids":[10]}]}'), chat=True)
    transcript.keep(encode_event(b'{"id":"x1","choices":[{"delta":{"content":"\\"b"},"token_ids":[11]}]}'), chat=True)
    transcript.keep(encode_event(b'{"id":"x1","choices":[{"delta":{"content":"c"},"token_ids":[12]}]}'), chat=True)
    assert (transcript.text(), transcript.ids, transcript.prompt_ids, transcript.shown_ids) == ('a"bc', [10, 11, 12], [1, 2], 3)
