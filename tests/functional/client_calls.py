"""One chat call through `tailguard.client`, with the sync or the async openai client, timed.

The sync client runs in a worker thread so the test's event loop keeps serving the fault server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from tailguard.client import RetryPolicy, Timeouts, async_openai_client, openai_client
from tests.functional.client_faults import fault_server

CHAT = [{"role": "user", "content": "hi"}]
KINDS = ("sync", "async")


@dataclass
class Outcome:
    elapsed_s: float = 0.0
    error: Exception | None = None
    texts: list[str] = field(default_factory=list)  # content the caller received, chunk by chunk
    answer: Any = None  # a non-stream call's response


def _options(timeouts: Timeouts | None, retry: RetryPolicy | None, kw: dict[str, Any]) -> dict[str, Any]:
    return {"api_key": "k", "timeouts": timeouts or Timeouts(connect=1, first_token=0.2, idle=0.2),
            "retry": retry or RetryPolicy(max_attempts=1), **kw}


async def call(kind: str, base_url: str | list[str], *, stream: bool = True, timeouts: Timeouts | None = None,
               retry: RetryPolicy | None = None, max_tokens: int | None = None, **kw: Any) -> Outcome:
    options = _options(timeouts, retry, kw)
    args: dict[str, Any] = {"model": "tailguard-sim", "messages": CHAT, "stream": stream}
    if max_tokens is not None:
        args["max_tokens"] = max_tokens
    if kind == "sync":
        return await asyncio.to_thread(_sync_call, base_url, options, args)
    out = Outcome()
    async with async_openai_client(base_url=base_url, **options) as client:
        completions = client.chat.completions  # the SDK's lazy imports, before the clock starts
        start = time.monotonic()
        try:
            got = await completions.create(**args)
            if stream:
                async for ch in got:
                    out.texts.extend(c.delta.content for c in ch.choices if c.delta.content)
            else:
                out.answer = got
        except Exception as err:  # the test looks at which one
            out.error = err
    out.elapsed_s = time.monotonic() - start
    return out


def _sync_call(base_url: str | list[str], options: dict[str, Any], args: dict[str, Any]) -> Outcome:
    out = Outcome()
    with openai_client(base_url=base_url, **options) as client:
        completions = client.chat.completions  # the SDK's lazy imports, before the clock starts
        start = time.monotonic()
        try:
            got = completions.create(**args)
            if args["stream"]:
                for ch in got:
                    out.texts.extend(c.delta.content for c in ch.choices if c.delta.content)
            else:
                out.answer = got
        except Exception as err:
            out.error = err
    out.elapsed_s = time.monotonic() - start
    return out


async def against(kind: str, fault: str, **kw: Any) -> tuple[Outcome, list[float]]:
    """One call to a fresh fault server's `fault`, bounded; the outcome and when each try arrived."""
    async with asyncio.timeout(5), fault_server() as f:
        out = await call(kind, f.base(fault), **kw)
    return out, f.hits[fault]
