"""Agent programs through a real gateway in front of two real simulators, with the clients users
point at us: a program named by a session header, one named by nothing and inferred from its
prompts, Claude Code's Messages calls (its `metadata.user_id` and session header), and sibling
calls sent together. Each call of a program lands where its last one ran; the access log and the
metrics carry the program's digest, the call's number and what named it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anthropic
import orjson
import pytest
from openai import AsyncOpenAI

from tailguard.gateway.ops.access import ACCESS_LOGGER
from tests.functional.gateways import gateway, sample, scrape

MODEL = "tailguard-sim"
SYSTEM = "You are a coding agent with tools to read and edit files. " * 20


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    return caplog


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]


async def _call(client: AsyncOpenAI, messages: list[dict[str, str]], **kw: Any) -> tuple[str, str]:
    """One streamed call: the backend that served it and the answer's text."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=6, stream=True, **kw)  # type: ignore[call-overload]
    text = [c.choices[0].delta.content or "" async for c in raw.parse() if c.choices]
    return raw.headers["x-tailguard-backend"], "".join(text)


async def _program(client: AsyncOpenAI, task: str, steps: int, **kw: Any) -> list[str]:
    """An agent's loop: each prompt is the last one, its answer and a tool's result."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    backends = []
    for i in range(steps):
        backend, answer = await _call(client, messages, **kw)
        backends.append(backend)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"tool result {i} " * 30}]
    return backends


async def test_a_programs_calls_are_known_as_one_and_kept_together(access: pytest.LogCaptureFixture) -> None:
    async with asyncio.timeout(60), gateway(sims=2) as gw, gw.client() as client:
        named = await _program(client, "Fix the parser.", 3, extra_headers={"X-Session-Id": "session-one"})
        inferred = await _program(client, "Write the docs for the queue module.", 3)
        # Two siblings of a new program sent together land together.
        siblings = await asyncio.gather(*(_call(client, [{"role": "user", "content": "best of two"}],
                                                extra_headers={"X-Tailguard-Program": "fan-out"}) for _ in range(2)))
        m = await scrape(gw.url)
    assert len(set(named)) == 1 and len(set(inferred)) == 1 and siblings[0][0] == siblings[1][0]
    lines = [ln for ln in _lines(access) if ln["status"] == 200]
    by_source: dict[str, list[tuple[str, int]]] = {}
    for ln in lines:
        by_source.setdefault(ln["program_source"], []).append((ln["program"], ln["program_call"]))
    first = by_source["x-session-id"][0][0]
    assert by_source["x-session-id"] == [(first, 1), (first, 2), (first, 3)]
    assert "session-one" not in first and len(first) == 16  # a keyed digest, never the session's id
    guessed = by_source["inferred"][0][0]
    assert by_source["inferred"] == [(guessed, 1), (guessed, 2), (guessed, 3)] and guessed != first
    assert sorted(c for _, c in by_source["x-tailguard-program"]) == [1, 2]
    assert sample(m, "tailguard_program_calls_total", **{"class": "interactive", "source": "x-session-id"}) == 3
    assert sample(m, "tailguard_programs_total", **{"class": "interactive", "source": "inferred"}) == 1


async def test_claude_codes_calls_are_one_program_by_its_session(access: pytest.LogCaptureFixture) -> None:
    """Claude Code names its session twice: `metadata.user_id` (`..._session_<uuid>`) and
    `X-Claude-Code-Session-Id`; the body's field comes first, and both name one program."""
    session = "4b1f0c2e-8d6a-4e59-9a2b-5c7d1e3f9a10"
    user_id = f"user_8f2a_account_77c1_session_{session}"
    async with asyncio.timeout(60), gateway(sims=2) as gw, \
            anthropic.AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0,
                                     default_headers={"X-Claude-Code-Session-Id": session}) as a:
        msgs: Any = [{"role": "user", "content": "list the files"}]
        first = await a.messages.create(model=MODEL, max_tokens=4, messages=msgs, system=SYSTEM,
                                        metadata={"user_id": user_id})
        msgs += [{"role": "assistant", "content": first.content[0].text},  # type: ignore[union-attr]
                 {"role": "user", "content": "README.md src/ tests/"}]
        await a.messages.create(model=MODEL, max_tokens=4, messages=msgs, system=SYSTEM)  # the header alone
    lines = [ln for ln in _lines(access) if ln["status"] == 200]
    assert [ln["program_source"] for ln in lines] == ["metadata.user_id", "x-claude-code-session-id"]
    assert lines[0]["program"] == lines[1]["program"] and [ln["program_call"] for ln in lines] == [1, 2]
    assert lines[0]["backend"] == lines[1]["backend"]
