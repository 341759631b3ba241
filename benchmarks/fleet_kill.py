"""A backend killed mid-run (issue 16, benchmark c): three simulators behind one gateway in the
quick form, long streamed chats arriving open loop, one simulator killed with SIGKILL while
streams run on it. Per stream: whether it ended whole (its full text, one id, usage exact), the
longest pause between two of its content chunks, and what it was charged; the streams that were
on the killed engine (migrated) against the others, side by side.

Target: no stream lost.

    .venv/bin/python benchmarks/fleet_kill.py [--rate 6] [--seconds 12] [--kill-at 5]

Writes benchmarks/results/fleet_kill.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tailguard.cli.experiment import free_port, spawned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_des_speed import pct  # noqa: E402  one nearest-rank percentile for all

RESULTS = Path(__file__).resolve().parent / "results"
MAX_TOKENS = 400
TIME_SCALE = 0.5


@dataclass
class Stream:
    backend: str = ""
    ids: set[str] = field(default_factory=set)
    text: str = ""
    gaps: list[float] = field(default_factory=list)
    usage: int | None = None
    error: str | None = None
    began: float = 0.0  # perf_counter instants of its head and its last byte
    ended: float = 0.0


async def one(session: aiohttp.ClientSession, url: str, at: float, t0: float, out: Stream) -> None:
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    body = {"model": "tailguard-sim", "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": MAX_TOKENS,
            "stream": True, "stream_options": {"include_usage": True}}
    last: float | None = None
    out.began = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            out.backend = resp.headers.get("X-Tailguard-Backend", "")
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    out.error = str(obj["error"].get("message"))
                    continue
                out.ids.add(obj["id"])
                for c in obj.get("choices", ()):
                    piece = (c.get("delta") or {}).get("content")
                    if piece:
                        now = time.perf_counter()
                        if last is not None:
                            out.gaps.append(now - last)
                        last = now
                        out.text += piece
                if obj.get("usage"):
                    out.usage = obj["usage"]["completion_tokens"]
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        out.error = f"{type(e).__name__}: {e}"
    out.ended = time.perf_counter()


async def token_id_prompts(session: aiohttp.ClientSession, sim: str) -> int:
    """Requests a simulator got with a prompt of token ids: the continuations sent by ids."""
    async with session.get(sim + "/metrics") as r:
        page = await r.text()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in page.splitlines()
               if line.startswith("tailguard_sim_token_id_prompts_total"))


async def main(args: argparse.Namespace) -> None:
    logs = RESULTS / "logs" / "fleet_kill"
    logs.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        procs: list[subprocess.Popen[bytes]] = []
        urls = []
        for i in range(3):
            port = free_port()
            args_sim = ["sim", "--port", str(port), "--max-num-seqs", "8", "--time-scale", str(TIME_SCALE)]
            procs.append(await stack.enter_async_context(
                spawned(args_sim, f"http://127.0.0.1:{port}/health", logs / f"sim{i}.log")))
            urls.append(f"http://127.0.0.1:{port}")
        gw_port = free_port()
        serve = ["serve", "--port", str(gw_port), "--max-concurrency", "8", *[a for u in urls for a in ("--backend", u)]]
        gw = f"http://127.0.0.1:{gw_port}"
        await stack.enter_async_context(spawned(serve, gw + "/health", logs / "gateway.log"))
        await asyncio.sleep(1.0)
        victim = urls[1].split("://", 1)[1]
        n = int(args.rate * args.seconds)
        streams = [Stream() for _ in range(n)]
        t0 = time.perf_counter() + 0.3
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            tasks = [asyncio.create_task(one(session, gw, i / args.rate, t0, s)) for i, s in enumerate(streams)]
            await asyncio.sleep(max(0.0, t0 + args.kill_at - time.perf_counter()))
            procs[1].send_signal(signal.SIGKILL)
            kill = time.perf_counter()
            killed_at = kill - t0
            await asyncio.gather(*tasks)
            by_ids = sum([await token_id_prompts(session, u) for i, u in enumerate(urls) if i != 1])
    expected = " tok" * MAX_TOKENS

    def summary(group: list[Stream]) -> dict[str, Any]:
        gaps = [max(s.gaps) for s in group if s.gaps]
        return {"streams": len(group), "whole": sum(1 for s in group if s.text == expected and s.error is None),
                "one_id": sum(1 for s in group if len(s.ids) == 1),
                "usage_exact": sum(1 for s in group if s.usage == MAX_TOKENS),
                "longest_pause_ms_p50": pct(gaps, 0.5) * 1000 if gaps else None,
                "longest_pause_ms_max": max(gaps) * 1000 if gaps else None,
                "errors": sorted({s.error for s in group if s.error})[:3]}

    moved = [s for s in streams if s.backend == victim and s.began < kill < s.ended]
    others = [s for s in streams if s not in moved]
    runs = {"under way on the killed engine": summary(moved), "the others": summary(others)}
    lost = sum(1 for s in streams if s.text != expected or s.error is not None)
    lines = ["# A backend killed mid-run", "",
             f"`.venv/bin/python benchmarks/fleet_kill.py --rate {args.rate} --seconds {args.seconds} --kill-at "
             f"{args.kill_at}` on {platform.platform()}: three simulators (8 slots, time scale {TIME_SCALE}) behind "
             f"`tailguard serve --backend A --backend B --backend C`, chats of {MAX_TOKENS} tokens at {args.rate}/s; B "
             f"killed with SIGKILL at {killed_at:.1f} s.", "",
             "| streams | count | whole | one id | usage exact | longest pause P50 | max |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f} ms"
        lines.append(f"| {name} | {r['streams']} | {r['whole']} | {r['one_id']} | {r['usage_exact']} | "
                     f"{ms(r['longest_pause_ms_p50'])} | {ms(r['longest_pause_ms_max'])} |")
    lines += ["", f"continued by token ids (prompts of token ids the survivors got): {by_ids}",
              f"streams lost: {lost} of {len(streams)} (target 0)", ""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fleet_kill.json").write_text(json.dumps({"machine": platform.platform(), "args": vars(args),
                                                         "killed_at_s": killed_at, "runs": runs, "by_token_ids": by_ids,
                                                         "lost": lost}, indent=2))
    (RESULTS / "fleet_kill.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=6.0, help="chats per wall second")
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--kill-at", type=float, default=5.0, help="wall seconds into the run")
    asyncio.run(main(p.parse_args()))
