"""What the batch tests share: input files, a gateway with batches on, waiting for a status."""

from __future__ import annotations

import asyncio
import io
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web
from openai import AsyncOpenAI
from openai.types import Batch

from tailguard.sim.fault import Faults
from tailguard.sim.server import create_app as create_sim_app
from tests.functional.gateways import engine
from tests.functional.sim_processes import SimProcess, _drain
from tests.servers import running

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


async def until_completed(client: AsyncOpenAI, batch_id: str, n: int, step_s: float = 0.05) -> None:
    """Until at least `n` lines of the batch are completed (the caller bounds the wait)."""
    while (b := await client.batches.retrieve(batch_id)).request_counts is None or b.request_counts.completed < n:
        await asyncio.sleep(step_s)


async def lines_of(client: AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [orjson.loads(ln) for ln in content.content.splitlines() if ln.strip()]


_CID = re.compile(r"line-\d{5}")


@dataclass
class CountingSim:
    """A real simulator whose every arriving request is counted by the custom_id in its prompt."""

    url: str
    arrived: Counter[str]


@asynccontextmanager
async def counting_sim(scale: float = 0.02, max_num_seqs: int = 64, faults: Faults = Faults()
                       ) -> AsyncIterator[CountingSim]:
    arrived: Counter[str] = Counter()

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            m = _CID.search((await request.read()).decode(errors="replace"))
            if m:
                arrived[m.group(0)] += 1
        resp: web.StreamResponse = await handler(request)
        return resp

    app = create_sim_app(engine(max_num_seqs=max_num_seqs), time_scale=scale, model_name=MODEL, faults=faults)
    app.middlewares.insert(0, count)  # before the faults: a request answered 500 arrived too
    async with running(app, handler_cancellation=True) as url:
        yield CountingSim(url, arrived)


@asynccontextmanager
async def gateway_process(config: Path) -> AsyncIterator[SimProcess]:
    """`tailguard serve --config config` as its own process, once it listens; killed at the end."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tailguard", "serve", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    drain: asyncio.Task[None] | None = None
    try:
        assert proc.stderr is not None
        said = []
        async with asyncio.timeout(30):
            while not (m := re.search(r"listening on (http://127\.0\.0\.1:\d+)", line := (
                    await proc.stderr.readline()).decode())):
                said.append(line)
                assert line, f"tailguard serve did not start: {''.join(said)}"
        drain = asyncio.create_task(_drain(proc.stderr))
        yield SimProcess(m.group(1), proc)  # a process at a URL that a test may SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if drain is not None:
            drain.cancel()


def gateway_config(path: Path, sim_url: str, batches: dict[str, Any], max_concurrency: int = 32) -> Path:
    """A `tailguard.yaml` for one simulator with batches on, written to `path`."""
    cfg = {"port": 0, "access_log": False, "log_format": "text", "auth": {"api_keys": {"k": {"name": "alice"}}},
           "backends": [{"name": "sim", "url": sim_url, "kind": "sim", "max_concurrency": max_concurrency}],
           "batches": {"poll_s": 0.2, **batches}}
    path.write_text(yaml.safe_dump(cfg))
    return path
