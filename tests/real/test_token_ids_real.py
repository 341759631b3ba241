"""A continuation by token ids against a real vLLM: the gateway's own pieces (`Transcript`, which
keeps the ids the engine returns, and `continuation_body`, which sends them back as a completions
prompt) on vLLM's real chunks. Greedy, a chat answer cut after a few tokens and continued by ids
is the answer vLLM gives uninterrupted, token for token, and comes back in chat's shape."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from tailguard.gateway.upstream.resume import Transcript, continuation_body
from tailguard.wire.chunks import delta_text, has_content, running_usage
from tailguard.wire.sse import DONE, SSEDecoder
from tests.real.processes import EngineProcess

pytestmark = pytest.mark.real

STEP_S = 60.0
WHOLE, FIRST = 24, 9  # tokens of the uninterrupted answer, and of the run that is cut
CHAT = {"messages": [{"role": "user", "content": "tell me about the queue"}], "temperature": 0.0}


async def stream(vllm: EngineProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The parsed chunks of one streamed request, as vLLM sent them."""
    body = {**body, "model": vllm.model, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    dec = SSEDecoder()
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s, s.post(vllm.base_url + path, json=body) as r:
        assert r.status == 200, await r.text()
        async for data in r.content.iter_any():
            out += [orjson.loads(e.data) for e in dec.feed(data) if e.data != DONE]
    return out


def relay(prog: Transcript, chunks: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """What the gateway's tracked relay does with each chunk: its ids kept, its text added, the
    chunk put in the client's shape. Returns the text and the chunks the client would get."""
    text, shaped = "", []
    for obj in chunks:
        obj = prog.absorb(obj)
        shaped.append(obj)
        if has_content(orjson.dumps(obj)):
            piece = delta_text(obj, chat=True)
            pt, ct = running_usage(obj)
            prog.add(piece, ct, pt)
            text += piece
    return text, shaped


async def test_a_chat_cut_and_continued_by_its_token_ids_is_the_uninterrupted_answer(
        vllm_server: EngineProcess) -> None:
    async with asyncio.timeout(STEP_S * 3):
        whole = await stream(vllm_server, "/v1/chat/completions", {**CHAT, "max_tokens": WHOLE})
        expected = "".join(delta_text(c, chat=True) for c in whole)
        prog = Transcript()
        prog.run_on(gives_ids=True, client_ids=False)
        first, _ = relay(prog, await stream(vllm_server, "/v1/chat/completions",
                                            {**CHAT, "max_tokens": FIRST, "return_token_ids": True}))
        assert prog.prompt_ids and prog.ids is not None and len(prog.ids) == FIRST and prog.by_ids()
        body, endpoint = continuation_body({**CHAT, "model": vllm_server.model, "max_tokens": WHOLE}, "chat", prog,
                                           by_ids=True)
        assert endpoint == "completions" and body["max_tokens"] == WHOLE - FIRST
        rest, shaped = relay(prog, await stream(vllm_server, "/v1/completions", body))
    assert first + rest == expected  # nothing re-tokenised: the model went on from its own tokens
    assert all(c["object"] == "chat.completion.chunk" for c in shaped)
    assert all("delta" in ch and "text" not in ch for c in shaped for ch in c["choices"])
    usage = shaped[-1]["usage"]  # the continuation's prompt: exactly the first prompt and the ids so far
    assert usage["prompt_tokens"] == len(prog.prompt_ids) + FIRST and usage["completion_tokens"] == WHOLE - FIRST
    assert prog.client_usage(usage["prompt_tokens"], usage["completion_tokens"]) == (len(prog.prompt_ids), WHOLE)
