"""A retry storm, three ways: 200 clients call a gateway that rejects everything for 3 s (an
overload spike), with `tailguard.client`, with the openai SDK's defaults, and with naive
fixed-interval retries. Shown: when the tries arrive (a histogram), the load the backend saw,
the P99 of the calls and the share that failed.

Processes on loopback: a `tailguard sim` (H100 preset, 64 sequences, real time) behind a
`tailguard serve` (`max_concurrency` 64, interactive queue of 1, `Retry-After` between 1 and 2 s).
The spike: 64 streams that would run for minutes take every slot; 3 s later they are closed and
the gateway is idle again. While they hold the slots, every call is refused with a 503 and a
Retry-After, as a gateway under an overload spike (or restarting behind a load balancer) answers.

Each arm gets fresh processes. Its 200 clients are separate client objects (200 application
instances, each with its own connection pool, budget and learned speed), started evenly over the
spike's first 0.5 s, each making one streamed call of 16 tokens. A call's latency runs from its
first send to its end, failed calls included; a try is counted when it is sent (a transport under
each client records it), which on loopback is when the gateway sees it.

- `tailguard.client`: `async_openai_client(...)` with `RetryPolicy(max_attempts=4, base_delay=1,
  max_delay=8, max_retry_after=60)` (full jitter on top of Retry-After) and the default budget.
- `openai SDK defaults`: `AsyncOpenAI(max_retries=2)`: 0.5 s x 2^n backoff less up to 25%,
  Retry-After honoured up to 120 s (openai 3.57's `_calculate_retry_timeout`).
- `naive fixed interval`: `AsyncOpenAI(max_retries=0)` in a loop that retries every 1 s, up to
  10 tries.
- `tailguard.client, one shared client`: the same 200 calls through one client, whose retry
  budget they share: what the budget does in an outage.

    .venv/bin/python benchmarks/client_retry_storm.py [--clients 200] [--spike 3] [--seed 1]

Writes benchmarks/results/client_retry_storm.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import os
import json
import platform
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import httpx2
import numpy as np
import openai
from openai.types.chat import ChatCompletionMessageParam

from tailguard.cli.experiment import Arm, SimSpec, target
from tailguard.client import RetryPolicy, Timeouts, client_state
from tailguard.client.async_transport import AsyncRetryTransport
from tailguard.client.chunks import StreamScan

RESULTS = Path(__file__).resolve().parent / "results"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 40}]
SLOTS = 64
TOKENS = 16
BIN_S = 0.25
HORIZON_S = 16.0
NAIVE_INTERVAL_S, NAIVE_TRIES = 1.0, 10
START_S = 0.5  # the calls start evenly over this (one process sends 200 SDK calls in about 0.3 s of CPU)
MAX_LAG_S = 0.25  # a first try sent later than this after its due time: the generator fell behind
SIM = SimSpec(max_num_seqs=SLOTS, time_scale=1.0)
GATEWAY = {
    "classes": [{"name": "interactive", "rank": 0, "max_queue_len": 1},
                {"name": "batch", "rank": 1, "max_share": 0.875}],
    "scheduler": {"retry_after_min_s": 1.0, "retry_after_max_s": 2.0},
    "access_log": False,
}


CALLER: contextvars.ContextVar[int] = contextvars.ContextVar("caller", default=-1)


@dataclass
class Clock:
    origin: float = 0.0  # the spike's start, set once every client is built
    first_send: dict[int, float] = field(default_factory=dict)  # caller -> when its first try went out
    retry_after: dict[str, int] = field(default_factory=dict)  # Retry-After values the gateway sent, counted


class Tries(httpx2.AsyncBaseTransport):
    """Records when each try is sent, under whatever retries the client above it makes."""

    def __init__(self, sent: list[float], clock: Clock) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._sent = sent
        self._clock = clock

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        t = time.monotonic() - self._clock.origin
        self._sent.append(t)
        self._clock.first_send.setdefault(CALLER.get(), t)
        response = await self._inner.handle_async_request(request)
        told = response.headers.get("retry-after")
        if told is not None:
            self._clock.retry_after[told] = self._clock.retry_after.get(told, 0) + 1
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class ArmResult:
    label: str
    sent: list[float] = field(default_factory=list)  # every try, seconds from the spike's start
    latency_s: list[float] = field(default_factory=list)  # every call, failed ones included
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    send_lag_s: list[float] = field(default_factory=list)  # each call's first try: sent how late
    retry_after: dict[str, int] = field(default_factory=dict)


async def _stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=TOKENS, stream=True)
    async for _ in stream:  # read to the end, as a caller would
        pass


async def _naive(client: openai.AsyncOpenAI) -> None:
    for attempt in range(NAIVE_TRIES):
        try:
            return await _stream(client)
        except (openai.APIStatusError, openai.APIConnectionError):
            if attempt == NAIVE_TRIES - 1:
                raise
            await asyncio.sleep(NAIVE_INTERVAL_S)


Factory = Callable[[str, int, list[float], "Clock"], openai.AsyncOpenAI]


def tailguard_client(url: str, i: int, sent: list[float], clock: Clock) -> openai.AsyncOpenAI:
    state = client_state(url, Timeouts(connect=5, first_token=30, idle=15),
                         RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=8.0, max_retry_after=60), seed=i)
    http = httpx2.AsyncClient(transport=AsyncRetryTransport(state, inner=Tries(sent, clock)))
    return openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0, http_client=http)


def sdk_client(url: str, i: int, sent: list[float], clock: Clock, retries: int = 2) -> openai.AsyncOpenAI:
    http = httpx2.AsyncClient(transport=Tries(sent, clock), timeout=httpx2.Timeout(600, connect=5))
    return openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=retries, http_client=http)


def naive_client(url: str, i: int, sent: list[float], clock: Clock) -> openai.AsyncOpenAI:
    return sdk_client(url, i, sent, clock, retries=0)


async def _blockers(session: aiohttp.ClientSession, url: str) -> list[aiohttp.ClientResponse]:
    """Streams that hold every slot (4,000 tokens: about half a minute at 64 sequences); each
    returns once its first content has arrived."""
    body = {"model": "tailguard-sim", "messages": CHAT, "max_tokens": 4000, "stream": True}

    async def one() -> aiohttp.ClientResponse:
        r = await session.post(f"{url}/v1/chat/completions", json=body)
        assert r.status == 200, r.status
        scan = StreamScan()
        async for piece in r.content.iter_any():
            if scan.feed(piece):
                break
        return r
    return list(await asyncio.gather(*(one() for _ in range(SLOTS))))


async def _warm_up(client: openai.AsyncOpenAI) -> None:
    """One refused call, not counted: the SDK imports its resources and builds its request
    transforms on first use, which would otherwise delay the first arm's first tries."""
    with contextlib.suppress(openai.OpenAIError):
        await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
    await client.close()


async def run_arm(label: str, make: Factory, call: Callable[[openai.AsyncOpenAI], Awaitable[None]],
                  clients: int, spike_s: float, shared: bool, logs: Path) -> ArmResult:
    res = ArmResult(label)
    arm = Arm(label=label.replace(" ", "_"), gateway=True, max_concurrency=SLOTS, config=GATEWAY)
    async with target(arm, SIM, logs) as url, aiohttp.ClientSession() as session:
        held = await _blockers(session, url)
        clock = Clock()
        one = make(f"{url}/v1", 0, res.sent, clock) if shared else None
        made = [one or make(f"{url}/v1", i, res.sent, clock) for i in range(clients)]
        await _warm_up(naive_client(f"{url}/v1", -1, [], clock))

        def release() -> None:  # the spike ends: the slots are free again
            for r in held:
                r.close()
        clock.origin = time.monotonic()
        releaser = asyncio.get_running_loop().call_later(spike_s, release)

        async def caller(i: int) -> None:
            CALLER.set(i)
            await asyncio.sleep(START_S * i / clients)
            start = time.monotonic()
            try:
                await call(made[i])
            except openai.OpenAIError as err:
                res.failed += 1
                res.errors[type(err).__name__] = res.errors.get(type(err).__name__, 0) + 1
            res.latency_s.append(time.monotonic() - start)
        await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(clients))), timeout=120)
        releaser.cancel()
        res.retry_after = clock.retry_after
        res.send_lag_s = [clock.first_send[i] - START_S * i / clients for i in range(clients) if i in clock.first_send]
        for c in {id(c): c for c in made}.values():
            await c.close()
    return res


ARMS: tuple[tuple[str, Factory, Callable[[openai.AsyncOpenAI], Awaitable[None]], bool], ...] = (
    ("tailguard.client", tailguard_client, _stream, False),
    ("openai SDK defaults", sdk_client, _stream, False),
    ("naive fixed interval", naive_client, _naive, False),
    ("tailguard.client, one shared client", tailguard_client, _stream, True),
)


def summarize(r: ArmResult, clients: int, spike_s: float) -> dict[str, Any]:
    sent = np.array(sorted(r.sent))
    retries = np.array(sorted(r.sent)[clients:]) if len(r.sent) > clients else np.array([])
    bins = np.arange(0.0, HORIZON_S + BIN_S, BIN_S)
    hist, _ = np.histogram(np.clip(sent, 0, HORIZON_S - 1e-9), bins=bins)
    per_100ms, _ = np.histogram(sent, bins=np.arange(0.0, max(HORIZON_S, float(sent.max()) + 0.1), 0.1))
    during = int(np.sum(sent < spike_s))
    lat = np.array(r.latency_s)
    return {
        "label": r.label, "calls": clients, "tries": int(len(sent)), "tries_per_call": len(sent) / clients,
        "tries_during_spike": during, "tries_after_spike": int(len(sent)) - during,
        "peak_tries_per_100ms": int(per_100ms.max()),
        "peak_tries_per_100ms_after_spike": int(per_100ms[int(round(spike_s / 0.1)):].max()),
        "retry_spread_s": float(np.std(retries)) if len(retries) else 0.0,
        "retry_peak_share_100ms": _peak_share(retries),
        "failed": r.failed, "failed_share": r.failed / clients, "errors": r.errors,
        "latency_p50_s": float(np.percentile(lat, 50)), "latency_p99_s": float(np.percentile(lat, 99)),
        "latency_max_s": float(lat.max()),
        "retry_after_sent": r.retry_after,
        "first_try_lag_p99_s": float(np.percentile(r.send_lag_s, 99)),
        "valid": bool(np.percentile(r.send_lag_s, 99) <= MAX_LAG_S),
        "histogram": {"bin_s": BIN_S, "counts": [int(c) for c in hist]},
    }


def _peak_share(retries: np.ndarray[Any, Any]) -> float:
    """The largest share of all retries that arrived within one 100 ms: 1.0 is a single wave."""
    if not len(retries):
        return 0.0
    counts, _ = np.histogram(retries, bins=np.arange(0.0, float(retries.max()) + 0.2, 0.1))
    return float(counts.max() / len(retries))


def markdown(out: dict[str, Any]) -> str:
    arms = out["arms"]
    lines = [
        "# Retry storm: 200 clients against a gateway that rejects everything for 3 s", "",
        f"Command: `{out['command']}`  ", f"Machine: {out['machine']}; run at {out['when']}", "",
        "| client | tries | tries/call | during spike | after | peak tries/100 ms | peak after the spike "
        "| retry spread (std, s) | largest retry wave (share in 100 ms) | P50 (s) | P99 (s) | failed "
        "| first-try lag P99 (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in arms:
        lines.append(f"| {a['label']} | {a['tries']} | {a['tries_per_call']:.2f} | {a['tries_during_spike']} | "
                     f"{a['tries_after_spike']} | {a['peak_tries_per_100ms']} | "
                     f"{a['peak_tries_per_100ms_after_spike']} | {a['retry_spread_s']:.2f} | "
                     f"{a['retry_peak_share_100ms']:.0%} | {a['latency_p50_s']:.2f} | {a['latency_p99_s']:.2f} | "
                     f"{a['failed_share']:.1%} | {a['first_try_lag_p99_s']:.2f}{'' if a['valid'] else ' (fell behind)'} |")
    lines += ["", f"Tries sent per {BIN_S} s (the spike ends at {out['spike_s']:g} s; one `#` is 4 tries):", "", "```"]
    for i in range(int(HORIZON_S / BIN_S)):
        row = " ".join(f"{a['histogram']['counts'][i]:4d} {'#' * ((a['histogram']['counts'][i] + 3) // 4):<50.50}"
                       for a in arms[:3])
        lines.append(f"{i * BIN_S:5.2f}s {row}")
    lines += ["```", "", "Columns of the histogram: " + ", ".join(a["label"] for a in arms[:3]) + ".", ""]
    for a in arms:
        told = ", ".join(f"{v} s x {n}" for v, n in sorted(a["retry_after_sent"].items()))
        lines.append(f"- {a['label']}: the gateway's Retry-After {told or 'none'}"
                     + (f"; failures by type {a['errors']}" if a["errors"] else ""))
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    random.seed(args.seed)  # the openai SDK draws its jitter from the global generator
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, make, call, shared in ARMS:
            print(f"== {label}", flush=True)
            r = await run_arm(label, make, call, args.clients, args.spike, shared, Path(tmp))
            results.append(summarize(r, args.clients, args.spike))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "histogram"}), flush=True)
    return {"command": " ".join(["benchmarks/client_retry_storm.py", *sys.argv[1:]]),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
                       f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end",
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "clients": args.clients,
            "spike_s": args.spike, "arms": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--spike", type=float, default=3.0, help="seconds the gateway rejects everything")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    out = asyncio.run(main_async(args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "client_retry_storm.json").write_text(json.dumps(out, indent=1) + "\n")
    (RESULTS / "client_retry_storm.md").write_text(markdown(out))
    print(markdown(out))


if __name__ == "__main__":
    main()
