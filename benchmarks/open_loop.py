"""A small open-loop client for the gateway benchmarks that need their own load shape (a burst
plus a steady stream, an overload step): each request is sent at its scheduled instant and
measured from it, streamed, with its status, first content chunk, end and the Retry-After it was
given. The bench (`tailguard bench`) is the general tool; this is the few lines these shapes need.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp


@dataclass
class Result:
    cls: str
    scheduled: float  # seconds after the run's start
    status: int | None = None
    ttft: float | None = None  # from the scheduled instant to the first content chunk
    end: float | None = None  # from the scheduled instant to the last byte
    error: str | None = None
    tokens: int = 0
    retry_after: str | None = None
    reason: str | None = None  # X-Tailguard-Reject-Reason
    lag: float | None = None  # how late it was sent (the generator falling behind)


async def send(session: aiohttp.ClientSession, url: str, cls: str, max_tokens: int, at: float, t0: float,
               out: list[Result], fresh_connection: bool = False, prompt: str | None = None) -> None:
    """One streamed chat sent at t0 + at (perf_counter seconds); appends its `Result` to `out`.
    `prompt`: its message (default: a short one, by class)."""
    r = Result(cls, at)
    out.append(r)
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    r.lag = time.perf_counter() - (t0 + at)
    if prompt is None:
        prompt = "Summarize the report." if cls == "batch" else "Hello there."
    body = {"model": "tailguard-sim", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True}
    headers = {"X-Tailguard-Class": cls}
    if fresh_connection:
        headers["Connection"] = "close"
    start = t0 + at
    try:
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            r.status = resp.status
            if resp.status != 200:
                r.retry_after = resp.headers.get("Retry-After")
                r.reason = resp.headers.get("X-Tailguard-Reject-Reason")
                r.error = f"{resp.status}: {(await resp.read())[:200]!r}"
                r.end = time.perf_counter() - start
                return
            done = False
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                    r.tokens += 1
                    if r.ttft is None:
                        r.ttft = time.perf_counter() - start
                elif b'"error"' in line:
                    r.error = line[:200].decode("utf-8", "replace")
                elif line.startswith(b"data: [DONE]"):
                    done = True
            if not done and r.error is None:  # a stream cut short is not an answer, however it ended
                r.error = "the stream ended without its data: [DONE]"
        r.end = time.perf_counter() - start
    except aiohttp.ClientError as e:
        r.error = repr(e)


async def first_token(session: aiohttp.ClientSession, url: str, body: dict[str, object], at: float,
                      t0: float) -> tuple[float | None, str | None]:
    """Send the streamed chat `body` at t0 + at; the time from then to its first content chunk
    (None if none came) and its error (None if it ended well)."""
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    start = t0 + at
    ttft: float | None = None
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return None, f"{resp.status}: {(await resp.read())[:200]!r}"
            done = False
            async for line in resp.content:
                if ttft is None and line.startswith(b"data: {") and b'"content":"' in line \
                        and b'"content":""' not in line:
                    ttft = time.perf_counter() - start
                elif line.startswith(b"data: [DONE]"):
                    done = True
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return ttft, f"{type(e).__name__}: {e}"
    return ttft, None if done else "the stream ended without its data: [DONE]"
