"""What the batch tests share: input files, a gateway with batches on, waiting for a status."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import orjson
from openai import AsyncOpenAI
from openai.types import Batch

MODEL = "tailguard-sim"


def input_file(n: int, *, max_tokens: int = 8, prefix: str = "line", endpoint: str = "/v1/chat/completions") -> bytes:
    """`n` lines, each with its own custom_id (`line-00000` ...) and that id in its prompt."""
    out = []
    for i in range(n):
        cid = f"{prefix}-{i:05d}"
        body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens}
        if endpoint == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": f"{cid}: say something"}]
        else:
            body["prompt"] = f"{cid}: say something"
        out.append(orjson.dumps({"custom_id": cid, "method": "POST", "url": endpoint, "body": body}))
    return b"\n".join(out) + b"\n"


async def submit(client: AsyncOpenAI, data: bytes, *, window: str = "24h",
                 endpoint: str = "/v1/chat/completions") -> Batch:
    f = await client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    return await client.batches.create(input_file_id=f.id, endpoint=endpoint,  # type: ignore[arg-type]
                                       completion_window=window)  # type: ignore[arg-type]


async def until_status(client: AsyncOpenAI, batch_id: str, *statuses: str, step_s: float = 0.1) -> Batch:
    """The batch once its status is one of `statuses` (the caller bounds the wait)."""
    while True:
        b = await client.batches.retrieve(batch_id)
        if b.status in statuses:
            return b
        await asyncio.sleep(step_s)


async def lines_of(client: AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [orjson.loads(ln) for ln in content.content.splitlines() if ln.strip()]
