"""Continuation bodies of a suspended generation: what the engine is asked to continue."""

from __future__ import annotations

from tailguard.front.intake import resumable
from tailguard.gateway.upstream.resume import Progress, continuation_body
from tailguard.wire.openai import chat_chunk, usage_dict
from tailguard.wire.sse import encode_event


def _tok(text: str, cid: str, running: int | None = None) -> bytes:
    usage = None if running is None else usage_dict(9, running)
    return encode_event(chat_chunk(cid, "m", 1, content=text, usage=usage))


def test_chat_continuation_appends_the_text_and_shrinks_the_budget() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100,
            "max_completion_tokens": 90, "min_tokens": 5}
    prog = Progress(parts=["Once", " upon", " a"], tokens=3)
    out = continuation_body(body, "chat", prog)
    assert out["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon a"}]
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert (out["max_tokens"], out["max_completion_tokens"], out["min_tokens"]) == (97, 87, 2)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 100  # untouched
    assert (prog.runs, prog.base_tokens, prog.added_prompt_tokens) == (2, 3, 4 + 3)  # 11 bytes -> 3 tokens
    # The client sees its own prompt and every token: upstream counted 7 more prompt tokens.
    assert prog.client_usage(19, 97) == (12, 100)


def test_a_prompt_the_first_run_counted_is_the_one_the_client_sees() -> None:
    """Where the engine puts a running usage on every chunk (vLLM), the client's prompt count is
    the first run's, exact, not the continuation's less an estimate of what it added."""
    prog = Progress()
    prog.add("Once", 1, 17)
    prog.add(" upon", 2, 17)
    continuation_body({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}, "chat", prog)
    prog.add(" a", 1, 30)  # the continuation's prompt: not the client's
    assert prog.client_usage(30, 8) == (17, 10)


def test_completion_continuation_and_a_client_continuing_its_own_message() -> None:
    prog = Progress(parts=["abcd"], tokens=1)
    out = continuation_body({"prompt": "x" * 8, "max_tokens": 10}, "completions", prog)
    assert (out["prompt"], out["max_tokens"], prog.added_prompt_tokens) == ("x" * 8 + "abcd", 9, 1)
    own = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The"}],
           "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 4}
    assert resumable(own, "chat")
    out = continuation_body(own, "chat", Progress(parts=[" end"], tokens=1))
    assert out["messages"][-1] == {"role": "assistant", "content": "The end"} and out["max_tokens"] == 3


def test_nothing_generated_yet_restarts_the_same_body() -> None:
    body = {"prompt": "p", "max_tokens": 10}
    prog = Progress()
    assert continuation_body(body, "completions", prog) is body
    assert prog.runs == 2 and prog.client_usage(1, 10) == (1, 10)


def test_a_lazy_stream_keeps_its_chunks_raw_until_it_must_be_continued() -> None:
    """A stream that may only be moved is relayed unparsed: its blocks of content events are
    kept as they came (a block may hold several, and a usage-only event), parsed when the
    continuation needs its text, with the first run's id and the engine's running count."""
    prog = Progress(lazy=True)
    prog.keep(_tok("Once", "x1"), chat=True)  # the first is parsed: its id
    prog.keep(_tok(" upon", "x1") + _tok(" a", "x1", running=4), chat=True)  # vLLM packed two tokens in one
    assert (prog.text(), prog.tokens, prog.first_id) == ("Once", 1, "x1")  # the block waits, raw
    out = continuation_body({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}, "chat", prog)
    assert out["messages"][-1] == {"role": "assistant", "content": "Once upon a"} and out["max_tokens"] == 6
    assert (prog.tokens, prog.first_id, prog.prompt_tokens, prog.lazy, prog.raw) == (4, "x1", 9, False, [])


def test_a_lazy_stream_reads_compact_chunks_by_their_bytes_and_keeps_the_rest_in_order() -> None:
    """The usual chunk's text is taken without a parse; one with an escape waits raw (at most a
    bounded number of blocks), and the text comes out in the order the client got it."""
    prog = Progress(lazy=True)
    texts = [f'{i} "q" ' if i % 3 == 0 else f"{i} " for i in range(600)]
    for i, t in enumerate(texts):
        prog.keep(_tok(t, "x"), chat=True)
        assert len(prog.raw) < 256
        if i % 3 == 1:
            assert not prog.raw  # a compact chunk read by its bytes, after what waited before it
    prog.decode(chat=True)
    assert prog.tokens == 600 and prog.text() == "".join(texts)
