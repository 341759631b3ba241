"""How much of the gateway's fixed cost per request is its HTTP server: the CPU a request costs
the gateway, beside the floor of the server it is built on and the floor of a bare one.

Three servers, each answering the same streamed chat request (about 104 prompt tokens) with one
content chunk and `[DONE]`:
- `httptools`: a bare `asyncio.Protocol` on llhttp that parses the request, reads its JSON body
  and writes the whole answer in one call: what a lean server costs;
- `aiohttp`: a minimal aiohttp app doing the same through `web.StreamResponse`, run as
  `tailguard serve` runs aiohttp (uvloop, handler cancellation on, no access log);
- `gateway`: `tailguard serve` relaying a 1-token answer from a `tailguard sim` (the simulator's
  CPU is not counted): the gateway's whole fixed cost, its upstream client included.

Each server in turn gets Poisson arrivals at `--rate` for `--seconds` from this process; the
server's user and kernel CPU per request come from /proc. `--rounds` repeats the three in turn
(the machine is shared: the spread between rounds is part of the result).

    .venv/bin/python benchmarks/server_floor.py [--rate 67] [--seconds 15] [--rounds 2]

Writes benchmarks/results/server_floor.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tailguard.cli.experiment import free_port, wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import PROMPT, RESULTS, cpu_seconds  # noqa: E402  beside this script

ARMS = ("httptools", "aiohttp", "gateway")
_CHUNK = (b'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
          b'"delta":{"content":" tok"},"finish_reason":"length"}]}\n\ndata: [DONE]\n\n')


def serve_httptools(port: int) -> None:
    """The bare floor: one parser per connection, the answer in one write."""
    import httptools
    import uvloop

    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = head + b"%x\r\n%b\r\n0\r\n\r\n" % (len(_CHUNK), _CHUNK)
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    class Bare(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]
            self.parser = httptools.HttpRequestParser(self)
            self.url, self.body = b"", bytearray()

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            if self.url.startswith(b"/health"):
                self.transport.write(ok)
                return
            orjson.loads(self.body)
            self.body.clear()
            self.transport.write(answer)

    async def main() -> None:
        await asyncio.get_running_loop().create_server(Bare, "127.0.0.1", port)
        await asyncio.Event().wait()

    uvloop.run(main())


def serve_aiohttp(port: int) -> None:
    """aiohttp's floor: the same answer from a handler, as the gateway's server runs."""
    import uvloop
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        orjson.loads(await request.read())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write_eof(_CHUNK)
        return resp

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.run(main())


async def one(session: aiohttp.ClientSession, url: str, body: bytes, failed: list[int]) -> None:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        async for _ in r.content.iter_any():
            pass
        if r.status != 200:
            failed.append(r.status)


async def load(url: str, pid: int, rate: float, seconds: float) -> dict[str, float]:
    """Poisson arrivals at `rate` for `seconds`; the server's CPU milliseconds per request."""
    body = orjson.dumps({"model": "tailguard-sim", "messages": PROMPT, "max_tokens": 1, "stream": True})
    rng, failed = random.Random(1), list[int]()
    user0, kernel0 = cpu_seconds([pid])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        tasks, start = [], time.perf_counter()
        due = start
        while due < start + seconds:
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(s, url, body, failed)))
        await asyncio.gather(*tasks)
    user1, kernel1 = cpu_seconds([pid])
    n = len(tasks)
    if failed:
        raise RuntimeError(f"{len(failed)} of {n} requests failed: {sorted(set(failed))}")
    return {"requests": n, "user_ms": (user1 - user0) * 1000 / n, "kernel_ms": (kernel1 - kernel0) * 1000 / n}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tg-floor-"))
    ports = {arm: free_port() for arm in ARMS}
    sim_port = free_port()
    py, here = sys.executable, str(Path(__file__).resolve())
    (tmp / "tailguard.yaml").write_text(
        f"port: {ports['gateway']}\nbackends:\n  - {{name: sim, url: 'http://127.0.0.1:{sim_port}', kind: sim, "
        "max_concurrency: 4096}\nclasses:\n  - {name: interactive, rank: 0, max_queue_len: 100000}\n"
        "  - {name: batch, rank: 1}\n")
    log = open(tmp / "servers.log", "wb")
    procs = {
        "sim": subprocess.Popen([py, "-m", "tailguard", "sim", "--port", str(sim_port), "--preset", args.preset,
                                 "--max-num-seqs", "4096", "--time-scale", "1"], stdout=subprocess.DEVNULL, stderr=log),
        "gateway": subprocess.Popen([py, "-m", "tailguard", "serve", "--config", str(tmp / "tailguard.yaml")],
                                    stdout=subprocess.DEVNULL, stderr=log),
        **{arm: subprocess.Popen([py, here, "--serve", arm, "--port", str(ports[arm])],
                                 stdout=subprocess.DEVNULL, stderr=log) for arm in ("httptools", "aiohttp")},
    }
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        await wait_healthy(f"http://127.0.0.1:{sim_port}/health", procs["sim"])
        for arm in ARMS:
            await wait_healthy(f"http://127.0.0.1:{ports[arm]}/health", procs[arm])
        for i in range(args.rounds):
            rounds.append({})
            for arm in ARMS:
                url = f"http://127.0.0.1:{ports[arm]}/v1/chat/completions"
                rounds[-1][arm] = r = await load(url, procs[arm].pid, args.rate, args.seconds)
                print(f"round {i + 1} {arm:9s} {r['requests']:.0f} requests: "
                      f"{r['user_ms']:.3f} ms user + {r['kernel_ms']:.3f} ms kernel per request", flush=True)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=10)
        log.close()
    median = {arm: {k: statistics.median(r[arm][k] for r in rounds) for k in ("user_ms", "kernel_ms")}
              for arm in ARMS}
    return {"rate": args.rate, "seconds": args.seconds, "rounds": rounds, "median": median}


def markdown(res: dict[str, Any]) -> str:
    med, rounds = res["median"], res["rounds"]
    lines = [
        "# The gateway's fixed cost beside its server's floor", "",
        f"Streamed 1-token chat answers, Poisson arrivals at {res['rate']:g}/s for {res['seconds']:g} s per server "
        f"and round, {len(rounds)} rounds, servers in turn (`benchmarks/server_floor.py`). CPU per request of the "
        "server process, from /proc. The two floors answer by themselves; the gateway relays from a simulator "
        "(not counted), so its cost includes its upstream client.", "",
        "| server | user ms/request (median) | kernel ms/request (median) | user, each round |",
        "|---|---:|---:|---|",
    ]
    for arm in ARMS:
        each = ", ".join(f"{r[arm]['user_ms']:.3f}" for r in rounds)
        lines.append(f"| {arm} | {med[arm]['user_ms']:.3f} | {med[arm]['kernel_ms']:.3f} | {each} |")
    aio, bare, gw = (med[a]["user_ms"] for a in ("aiohttp", "httptools", "gateway"))
    lines += ["", f"aiohttp's server costs {aio - bare:.3f} ms of user time per request more than a bare "
              f"llhttp protocol; the gateway's own work beyond aiohttp's floor is {gw - aio:.3f} ms.", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rate", type=float, default=67.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--preset", default="h100-llama8b")
    p.add_argument("--serve", choices=("httptools", "aiohttp"), help=argparse.SUPPRESS)  # a floor server's process
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        (serve_httptools if args.serve == "httptools" else serve_aiohttp)(args.port)
        return
    import uvloop

    res = uvloop.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "server_floor.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "server_floor.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
