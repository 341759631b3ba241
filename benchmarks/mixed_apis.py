"""Every API on one engine: chats (`/v1/chat/completions`), Responses API agents (`/v1/responses`,
a long shared context) and a retrieval batch (`/v1/embeddings`, several inputs per request), on
one simulated H100 (`tailguard sim --max-num-seqs 8`), straight to the engine and through
`tailguard serve` (the embeddings go to their own class, `embeddings`, here sure of one slot of
eight and allowed two: `EMBED_MIN_SHARE`, `--embed-max-share`). A third run sends the embeddings alone, straight: the throughput they get
when nothing else competes.

    .venv/bin/python benchmarks/mixed_apis.py [--duration 240] [--time-scale 1.0] [--agent-rate 1.25]
        [--embed-rate 26] [--embed-max-share 0.25] [--name mixed_apis]

Open loop, each class its own Poisson arrivals (rates in simulated requests per second, below);
latencies are simulated seconds. Writes benchmarks/results/NAME.md and .json, and each run's
bench folder under benchmarks/results/NAME/ (NAME: `--name`). The issue's targets (#19): chat and agent P99
TTFT at least 10x lower through the gateway; the embeddings' throughput within 1.3x of alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

from rich.console import Console

from tailguard.bench.workload import parse_workload
from tailguard.cli.experiment import Arm, SimSpec, run_arms
from tailguard.config.classes import default_classes

RESULTS = Path(__file__).resolve().parent / "results"
# Simulated requests per second of each class (the agents' is `--agent-rate`: a P99 needs
# hundreds of them, and a 30 s run at 0.5/s had 16).
RATES = {"chat": 3.0, "agent": 1.25, "embed": 26.0}
# Each embeddings request is a prefill of 2 x 1024 tokens, and every engine step that carries one
# is longer for every sequence decoding beside it (step time a + b x prefill tokens): the slots the
# `embeddings` class may hold bound how much of each step is theirs. It is sure of one slot of
# eight (`min_share`) and may take a second (`max_share`, `--embed-max-share`): held to one, it
# served 17 requests/s of the 26 sent in a 200 s run, its backlog growing for the whole run.
EMBED_MIN_SHARE = 0.125


def workload(scale: float, rates: dict[str, float], only: str | None = None) -> Any:
    """The mix (or one class of it); arrival rates converted to wall seconds."""
    classes = [
        {"name": "chat", "prompt_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.5, "max": 1000},
         "max_tokens": 32},
        {"name": "agent", "endpoint": "responses", "prompt_tokens": 1500, "max_tokens": 64,
         "system_prompt": {"tokens": 1000, "shared": True}},
        {"name": "embed", "endpoint": "embeddings", "prompt_tokens": 2048, "inputs": 2, "stream": False},
    ]
    chosen = [c for c in classes if only is None or c["name"] == only]
    for c in chosen:
        c.update(weight=0, arrival={"rate": rates[str(c["name"])] / scale})
    return parse_workload({"name": "mixed-apis" if only is None else f"mixed-apis-{only}", "classes": chosen})


def _get(s: dict[str, Any], cls: str, *path: str) -> float | None:
    v: Any = s["classes"].get(cls)
    for k in path:
        v = None if v is None else v.get(k)
    return None if v is None else float(v)


def render(args: argparse.Namespace, runs: dict[str, dict[str, Any]]) -> str:
    straight, gw, alone = runs["straight"], runs["gateway"], runs["embeddings alone"]
    lines = [
        "# Every API on one engine: chats, Responses agents and an embeddings batch",
        "",
        f"`.venv/bin/python benchmarks/mixed_apis.py --duration {args.duration} --time-scale {args.time_scale} "
        f"--max-concurrency {args.max_concurrency} --agent-rate {args.agent_rate} --embed-rate {args.embed_rate} "
        f"--embed-max-share {args.embed_max_share} --name {args.name}`",
        "",
        f"Simulator `tailguard sim --preset h100-llama8b --max-num-seqs 8 --time-scale {args.time_scale}`; gateway "
        "`tailguard serve` (chats and agents `interactive`, embeddings `embeddings`), "
        f"`max_concurrency` {args.max_concurrency}, the `embeddings` class at `min_share` {EMBED_MIN_SHARE} "
        f"and `max_share` {args.embed_max_share}. Open loop for {args.duration} wall s, Poisson per class: chat {RATES['chat']}/s "
        f"(~150-token prompts, 32 tokens out), agent {args.agent_rate}/s (`/v1/responses`, 1500-token prompt of which "
        f"1000 shared, 64 out, streamed), embed {args.embed_rate}/s (`/v1/embeddings`, 2 inputs of 1024 tokens). "
        f"Simulated seconds; {os.cpu_count()} cores ({platform.machine()}, Python {platform.python_version()}), "
        f"load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| class | run | ok/count | TTFT p50 s | TTFT p99 s | E2E p99 s | requests/s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for cls in ("chat", "agent", "embed"):
        for label, s in runs.items():
            if cls not in s["classes"]:
                continue
            lines.append(f"| {cls} | {label} | {_get(s, cls, 'ok'):.0f}/{_get(s, cls, 'count'):.0f} "
                         f"| {_f(_get(s, cls, 'ttft_s', 'p50'))} | {_f(_get(s, cls, 'ttft_s', 'p99'))} "
                         f"| {_f(_get(s, cls, 'e2e_s', 'p99'))} | {_f(_get(s, cls, 'throughput', 'requests_per_s'), 2)} |")
    lines += ["", "Against the issue's targets:", ""]
    for cls in ("chat", "agent"):
        a, b = _get(straight, cls, "ttft_s", "p99"), _get(gw, cls, "ttft_s", "p99")
        lines.append(f"- {cls} P99 TTFT straight / through the gateway: {_ratio(a, b)} (target >= 10x)")
    a, b = _get(alone, "embed", "throughput", "requests_per_s"), _get(gw, "embed", "throughput", "requests_per_s")
    lines.append(f"- embeddings throughput alone / in the mix through the gateway: {_ratio(a, b)} (target <= 1.3x)")
    return "\n".join(lines) + "\n"


def _f(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.1f}x"


async def main(args: argparse.Namespace) -> None:
    console = Console()
    sim = SimSpec(max_num_seqs=8, time_scale=args.time_scale)
    out = RESULTS / args.name
    load = {"duration_s": args.duration, "seed": args.seed}
    runs: dict[str, dict[str, Any]] = {}
    rates = {**RATES, "agent": args.agent_rate, "embed": args.embed_rate}
    classes = [c.model_dump() for c in default_classes()]
    for c in classes:
        if c["name"] == "embeddings":
            c.update(max_share=args.embed_max_share, min_share=EMBED_MIN_SHARE)
    gateway = Arm("gateway", gateway=True, max_concurrency=args.max_concurrency, config={"classes": classes})
    for arm, only in ((Arm("straight"), None), (gateway, None),
                      (Arm("embeddings alone"), "embed")):
        got = await run_arms([arm], sim, {**load, "workload": workload(args.time_scale, rates, only)}, out, console,
                             tables=False)
        runs.update(got)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(
        {label: {c: {k: s["classes"][c][k] for k in ("count", "ok", "ttft_s", "e2e_s", "throughput")}
                 for c in s["classes"]} for label, s in runs.items()}, indent=1))
    md = render(args, runs)
    (RESULTS / f"{args.name}.md").write_text(md)
    console.print(md)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=240.0, help="wall seconds of load per run")
    p.add_argument("--agent-rate", type=float, default=RATES["agent"], help="Responses agents per simulated second")
    p.add_argument("--embed-rate", type=float, default=RATES["embed"], help="embeddings requests per simulated second")
    p.add_argument("--name", default="mixed_apis", help="the results' name under benchmarks/results/")
    p.add_argument("--embed-max-share", type=float, default=0.25, help="the embeddings class's max_share")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-concurrency", type=int, default=8, help="the gateway's cap on the engine (8 sequences)")
    return p.parse_args()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(parse_args()))
