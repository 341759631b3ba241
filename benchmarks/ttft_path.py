"""Where a request's added TTFT goes inside the gateway: the time from the lean server having a
request's head to each step of its way to the upstream write, and the first content chunk's time
from the relay having its read (its task woken) to the client's write.

The gateway (`tailguard serve` in front of `tailguard sim`, as `gateway_profile.py` runs them) is
started with a `sitecustomize` of this script's own on its `PYTHONPATH` that wraps the methods
below and keeps each request's marks (perf_counter, from a context variable set where the lean
connection starts the request's task, which every await of that request inherits). Nothing of
it is in the gateway's code: the figures are the code as it runs, plus the wrappers' own cost
(about 1 us a mark). Two loads: requests one at a time (an idle machine: cold caches, no loop
contention) and an open loop at `--rate`.

    .venv/bin/python benchmarks/ttft_path.py [--requests 300] [--rate 200] [--seconds 15]

Writes benchmarks/results/ttft_path.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import pct  # noqa: E402  beside this script
from gateway_profile import Stack, open_loop, sequential  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TOKENS = 64

# The marks, in the order a request passes them: (name, module, class, method, when).
STEPS = (
    ("task started", "tailguard.gateway.http.proxy", "Proxy", "answer", "enter"),
    ("body, key and class read", "tailguard.gateway.lifecycle", "Lifecycle", "serve", "enter"),
    ("parsed, classified, exchange set up", "tailguard.gateway.dispatch", "Dispatcher", "admit", "enter"),
    ("admitted by the front", "tailguard.gateway.dispatch", "Dispatcher", "admit", "exit"),
    ("exchange started", "tailguard.gateway.exchange", "Exchange", "run", "enter"),
    ("upstream open (pool, head)", "tailguard.gateway.upstream.client", "Upstream", "open", "enter"),
    ("upstream write", "tailguard.gateway.upstream.h1", "H1Connection", "request", "call"),
)

HOOK = '''
import contextvars, importlib, json, os, time

pc = time.perf_counter
START = contextvars.ContextVar("tg_ttft_path_start")
MARKS = {}
FIRST = []
OUT = os.environ["TG_TTFT_PATH_OUT"]
STEPS = %(steps)r


def mark(name):
    t0 = START.get(None)
    if t0 is not None:
        MARKS.setdefault(name, []).append(pc() - t0)


def dump():
    with open(OUT + ".tmp", "w") as f:
        json.dump({"marks": MARKS, "first_chunk": FIRST}, f)
    os.replace(OUT + ".tmp", OUT)  # read whole at any time: the worker ends with os._exit


def wrap(name, module, cls, method, when):
    owner = getattr(importlib.import_module(module), cls)
    orig = getattr(owner, method)
    if when == "call":
        def w(self, *a, **k):
            mark(name)
            if len(MARKS.get(name, ())) %% 50 == 1:  # from the first on: the worker never exits cleanly
                dump()
            return orig(self, *a, **k)
    elif when == "enter":
        async def w(self, *a, **k):
            mark(name)
            return await orig(self, *a, **k)
    else:
        async def w(self, *a, **k):
            r = await orig(self, *a, **k)
            mark(name)
            return r
    setattr(owner, method, w)


lean = importlib.import_module("tailguard.gateway.http.lean")
_serve = lean.LeanProtocol._serve


def serve(self):
    token = START.set(pc())  # the request's task copies the context, with its start
    try:
        _serve(self)
    finally:
        START.reset(token)


lean.LeanProtocol._serve = serve
for step in STEPS:
    wrap(*step)

stream = importlib.import_module("tailguard.gateway.upstream.stream")
_emit = stream.StreamRelay._emit


async def emit(self, chunk, content, last, now):
    began = self.sink.started
    await _emit(self, chunk, content, last, now)
    if not began and self.sink.started:  # the client's stream began: its first content is out
        FIRST.append(pc() - now)


stream.StreamRelay._emit = emit
'''


async def _measure(rate: float, requests: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tg-ttft-path-") as d:
        tmp = Path(d)
        hook = tmp / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK % {"steps": STEPS})
        out = tmp / "marks.json"
        env = {**os.environ, "TG_TTFT_PATH_OUT": str(out),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
        stack = Stack(tmp, [], gw_env=env)  # the hook in the gateway alone
        try:
            await stack.ready()
            if rate:
                await open_loop(stack.url, TOKENS, rate, seconds)
            else:
                await sequential(stack.url, TOKENS, requests)
        finally:
            stack.stop()
        data = json.loads(out.read_text())
    marks, first = data["marks"], data["first_chunk"]
    steps = [{"step": name, **_us(marks.get(name, []))} for name, *_ in STEPS]
    return {"rate_per_s": rate, "steps": steps, "first_chunk": _us(first)}


def _us(seconds: list[float]) -> dict[str, Any]:
    return {"n": len(seconds), "p50_us": pct(seconds, 50) * 1e6, "p90_us": pct(seconds, 90) * 1e6}


def markdown(res: dict[str, Any]) -> str:
    runs = res["runs"]
    heads = ["one at a time" if r["rate_per_s"] == 0 else f"{r['rate_per_s']:.0f}/s" for r in runs]
    lines = ["# Where a request's added TTFT goes", "",
             f"`benchmarks/ttft_path.py`: {TOKENS}-token streams from `tailguard sim` through `tailguard serve`; "
             "microseconds from the lean server having the request's head, P50 (P90).", "",
             "| step | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(runs)]
    for i, (name, *_) in enumerate(STEPS):
        cells = [f"{r['steps'][i]['p50_us']:.0f} ({r['steps'][i]['p90_us']:.0f})" for r in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = [f"{r['first_chunk']['p50_us']:.0f} ({r['first_chunk']['p90_us']:.0f})" for r in runs]
    lines += ["| the first content chunk: the relay having its read, to the client's write | " + " | ".join(cells) + " |", ""]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = [await _measure(0.0, args.requests, 0.0), await _measure(args.rate, 0, args.seconds)]
    return {"benchmark": "ttft_path", "tokens": TOKENS, "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300, help="requests one at a time")
    p.add_argument("--rate", type=float, default=200.0, help="the open loop's rate")
    p.add_argument("--seconds", type=float, default=15.0, help="the open loop's length")
    args = p.parse_args()
    res = asyncio.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ttft_path.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "ttft_path.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
