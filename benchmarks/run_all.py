"""`make bench`: run every benchmark in turn, one at a time (they share 2 cores, so never in
parallel), each writing its own results under benchmarks/results/. Exits non-zero if any failed.

    .venv/bin/python benchmarks/run_all.py [name ...]     # default: all, in the order below
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The real-engine benchmarks (seed_real, quick_form --engine llamacpp) need `make engines` and run
# from `make bench-real`.
# Each entry: a script in this folder and its arguments.
BENCHMARKS: tuple[tuple[str, ...], ...] = (
    ("sim_des_speed",), ("sim_des_vs_http",), ("seed_des",),
    ("seed_des", "--prefix-caching", "--runs", "straight,ranked-sjf"),
    ("seed_hol",), ("seed_gateway",),
    ("seed_gateway", "--duration", "40", "--warmup", "4", "--arms", "straight,ranked-sjf", "--prefix-caching"),
    ("gateway_overhead",), ("server_floor",), ("nginx_class",), ("ttft_path",), ("speedups_ab",), ("bench_ceiling",), ("client_retry_storm",), ("seed_doctor",),
    ("quick_form",), ("overload",), ("fleet_routing",), ("fleet_slow",), ("fleet_kill",), ("adaptive_caps",),
    ("fair_share",), ("limit_cost",), ("batch_capacity",), ("batch_interference_des",), ("shared_limit_cost",),
    ("trace_replay",), ("peer_aiperf",), ("agents",),
)


def main(names: list[str]) -> int:
    known = sorted({script for script, *_ in BENCHMARKS})
    unknown = [n for n in names if n not in known and not (HERE / f"{n}.py").is_file()]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if names:  # every entry of a named script, and a script not listed above with no arguments
        chosen = [b for b in BENCHMARKS if b[0] in names] + [(n,) for n in names if n not in known]
    else:
        chosen = list(BENCHMARKS)
    failed = []
    for script, *args in chosen:
        label = " ".join([script, *args])
        print(f"== {label}", flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, str(HERE / f"{script}.py"), *args])
        print(f"== {label}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {time.monotonic() - started:.0f} s", flush=True)
        if rc != 0:
            failed.append(label)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
