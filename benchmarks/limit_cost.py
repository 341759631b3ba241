"""What callers' limits cost per request in memory mode: the front's admission and end of a request
(`Front.handle(Arrive)` then `Finished`) with a caller that has `rpm_limit`, `tpm_limit` and
`max_parallel_requests` (reserve at admission, settle at the end), against the same with no limits,
and the limits object alone. Target (issue 17): under 0.2 ms of gateway CPU a request.
Prints and writes benchmarks/results/limit_cost.{json,md}.

    cd benchmarks && ../.venv/bin/python limit_cost.py [--requests 200000]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import orjson

from tailguard.front.events import Arrive, Finished
from tailguard.front.front import Front
from tailguard.front.limits import CallerLimits
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams
from tailguard.types import Outcome

RESULTS = Path(__file__).resolve().parent / "results"
LIMITED = CallerSpec("app", requests_per_minute=10**9, tokens_per_minute=10**12, max_parallel=10**6)


def front_us(n: int, limited: bool) -> float:
    """Microseconds of CPU per request through the front: arrive (started at once) and finish."""
    f = Front(FrontParams(classes=[ClassSpec(name="interactive")], backends=[BackendSpec("e", max_concurrency=10**6)],
                          callers=[LIMITED] if limited else []))
    caller = "app" if limited else None
    t0 = time.process_time()
    for i in range(n):
        rid = str(i)
        f.handle(Arrive(rid, "interactive", 600, max_tokens=100, caller=caller), i * 1e-4)
        f.handle(Finished(rid, Outcome.SUCCESS, tokens=540), i * 1e-4)
    return (time.process_time() - t0) / n * 1e6


def limits_us(n: int) -> float:
    limits = CallerLimits([LIMITED])
    t0 = time.process_time()
    for i in range(n):
        now = i * 1e-4
        if limits.refusal("app", 600, now) is None:
            limits.settle("app", limits.take("app", 600, now), 540, now)
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs = {
        "front, no limits (us/request)": statistics.median(front_us(args.requests, False) for _ in range(args.repeats)),
        "front, rpm+tpm+parallel (us/request)": statistics.median(front_us(args.requests, True)
                                                                  for _ in range(args.repeats)),
        "limits alone: refusal+take+settle (us/request)": statistics.median(limits_us(args.requests)
                                                                            for _ in range(args.repeats)),
    }
    for k, v in runs.items():
        print(f"{k}: {v:.2f}")
    doc = {"benchmark": "limit_cost", "command": " ".join(["benchmarks/limit_cost.py", *sys.argv[1:]]),
           "machine": platform.platform(), "args": vars(args), "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "limit_cost.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    lines = [f"# limit_cost\n\n`{doc['command']}` ({doc['machine']}), medians of {args.repeats} runs, CPU time\n",
             "| what | us / request |", "|---|---|"] + [f"| {k.split(' (')[0]} | {v:.2f} |" for k, v in runs.items()]
    (RESULTS / "limit_cost.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
