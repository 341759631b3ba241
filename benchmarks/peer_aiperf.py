"""tailguard bench beside NVIDIA's AIPerf on the same target and load (issue 35, point 6): one
`tailguard sim`, the same closed loop, prompt and answer lengths, streamed chat with ignore_eos;
each tool's TTFT, E2E, per-chunk gap, per-request TPOT (AIPerf's "ITL"), output throughput and
measured lengths side by side, under the names docs/bench.md maps.

AIPerf is not one of tailguard's dependencies: `make aiperf` installs it in a virtualenv of its
own, `.venv-aiperf`. It is given a tokenizer of one character a token (benchmarks/data/char_tokenizer:
its builtin one downloads tiktoken's tables) and 4x the prompt length in its tokens, so its prompts
are as long as the simulator counts ours (ceil(bytes / 4)); lengths and TPOT from the server's
`usage` (`--use-server-token-count`) as ours are:

    make aiperf && .venv/bin/python benchmarks/peer_aiperf.py [--aiperf .venv-aiperf/bin/aiperf]

Writes benchmarks/results/peer_aiperf.{json,md} and both tools' outputs under
benchmarks/results/peer_aiperf/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tailguard.cli.experiment import free_port, spawned

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# A tokenizer of one character a token (made by its make.py): AIPerf's builtin one downloads its tables.
TOKENIZER = HERE / "data" / "char_tokenizer"
# (what, tailguard's summary.json path, AIPerf's metric name); seconds in tailguard, ms in AIPerf
ROWS = [
    ("TTFT", ("ttft_s",), "time_to_first_token"),
    ("E2E", ("e2e_s",), "request_latency"),
    ("gap between chunks, pooled (our ITL/chunk, AIPerf's ICL)", ("itl_s",), "inter_chunk_latency"),
    ("TPOT per request (AIPerf's ITL)", ("tpot_s",), "inter_token_latency"),
]
LENGTHS = [("input tokens", "input_tokens", "input_sequence_length"),
           ("output tokens", "output_tokens", "output_sequence_length")]


def run(cmd: list[str], log: Path) -> None:
    with open(log, "wb") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=1800)


def aiperf_metrics(folder: Path) -> dict[str, Any]:
    """AIPerf's summary (`profile_export_aiperf.json`), wherever under `folder` it wrote it."""
    found = sorted(folder.rglob("profile_export_aiperf.json"))
    if not found:
        raise SystemExit(f"AIPerf wrote no profile_export_aiperf.json under {folder}")
    data: dict[str, Any] = json.loads(found[-1].read_text())
    records: dict[str, Any] = data.get("records", data)
    return records


def stat(metric: dict[str, Any] | None, key: str) -> float | None:
    if not metric or metric.get(key) is None:
        return None
    v = float(metric[key])
    return v / 1000 if metric.get("unit") == "ms" else v


def side_by_side(ours: dict[str, Any], theirs: dict[str, Any]) -> list[dict[str, Any]]:
    o = ours["overall"]
    rows = []
    for what, path, name in ROWS:
        mine = o[path[0]]
        for key, q in (("p50", "p50"), ("p99", "p99"), ("avg", "mean")):
            a, b = mine.get(q), stat(theirs.get(name), key)
            rows.append({"metric": f"{what} {key}", "tailguard_s": a, "aiperf_s": b,
                         "ratio": None if a is None or not b else round(a / b, 3)})
    a, b = o["throughput"]["output_tokens_per_s"], stat(theirs.get("output_token_throughput"), "avg")
    rows.append({"metric": "output tokens/s", "tailguard_s": a, "aiperf_s": b,
                 "ratio": None if not b else round(a / b, 3)})
    for what, ours_key, name in LENGTHS:
        a, b = o["lengths"][ours_key].get("mean"), stat(theirs.get(name), "avg")
        rows.append({"metric": f"{what} mean", "tailguard_s": a, "aiperf_s": b,
                     "ratio": None if a is None or not b else round(a / b, 3)})
    return rows


def markdown(r: dict[str, Any]) -> str:
    def f(v: float | None, metric: str) -> str:
        if v is None:
            return "-"
        if "tokens" in metric:
            return f"{v:.1f}"
        return f"{v * 1000:.2f} ms" if v < 1 else f"{v:.3f} s"
    lines = ["# tailguard bench beside AIPerf 0.13 (issue 35)", "", f"`{r['command']}`", "",
             f"One `tailguard sim --preset {r['preset']} --max-num-seqs {r['max_num_seqs']}` at real time; each tool: "
             f"{r['requests']} streamed chat requests in a closed loop of {r['concurrency']}, prompts of "
             f"{r['input_tokens']} tokens, answers of {r['output_tokens']} (ignore_eos). Load average after: "
             f"{', '.join(str(x) for x in r['load_average'])} on {os.cpu_count()} shared cores; niceness {r['nice']}.",
             "", f"tailguard's run: {r['tailguard_validity']}", "",
             "| metric | tailguard bench | AIPerf | tailguard / AIPerf |", "|---|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['metric']} | {f(row['tailguard_s'], row['metric'])} | {f(row['aiperf_s'], row['metric'])} "
                     f"| {'-' if row['ratio'] is None else row['ratio']} |")
    return "\n".join(lines) + "\n"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", default=str(HERE.parent / ".venv-aiperf" / "bin" / "aiperf"),
                    help="AIPerf's executable (`make aiperf` installs it in .venv-aiperf)")
    ap.add_argument("--preset", default="a100-llama8b")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128)
    args = ap.parse_args()
    out = RESULTS / "peer_aiperf"
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with spawned(["sim", "--port", str(port), "--preset", args.preset, "--max-num-seqs", str(args.max_num_seqs),
                        "--time-scale", "1"], f"{url}/health", out / "sim.log"):
        ours = out / "tailguard"
        await asyncio.to_thread(run, [sys.executable, "-m", "tailguard", "bench", "--url", url, "--concurrency",
                                      str(args.concurrency), "--requests", str(args.requests), "--input-tokens",
                                      str(args.input_tokens), "--output-tokens", str(args.output_tokens), "--time-scale",
                                      "1", "--out", str(ours), "--quiet"], out / "tailguard.log")
        theirs = out / "aiperf"
        await asyncio.to_thread(run, [
            args.aiperf, "profile", "--model", "tailguard-sim", "--url", url, "--endpoint-type", "chat", "--streaming",
            "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
            # one character a token (TOKENIZER): 4 of AIPerf's make one of the simulator's
            "--synthetic-input-tokens-mean", str(4 * args.input_tokens), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(args.output_tokens), "--output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--tokenizer", str(TOKENIZER), "--use-server-token-count",
            "--random-seed", "0",
            "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(theirs)],
            out / "aiperf.log")
    summary = json.loads((ours / "summary.json").read_text())
    v = summary["validity"]
    result = {
        "benchmark": "peer_aiperf", "command": "python benchmarks/peer_aiperf.py " + " ".join(sys.argv[1:]),
        "preset": args.preset, "max_num_seqs": args.max_num_seqs, "concurrency": args.concurrency,
        "requests": args.requests, "input_tokens": args.input_tokens, "output_tokens": args.output_tokens,
        "rows": side_by_side(summary, aiperf_metrics(theirs)),
        "tailguard_validity": ("valid" if v["valid"] else f"INVALID ({v.get('cause')}): {v.get('advice')}"),
        "load_average": [round(x, 2) for x in os.getloadavg()], "nice": os.nice(0),
    }
    (RESULTS / "peer_aiperf.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "peer_aiperf.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
