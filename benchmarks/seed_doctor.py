"""The seed experiment's "before" run diagnosed, and the max_concurrency sweep behind the fix.

1. Before: `tailguard demo`'s first arm (`seed-mixed`, 16 closed-loop clients, straight to
   `tailguard sim --preset h100-llama8b --max-num-seqs 8`, time scale 0.25, its own process),
   with the engine's /metrics scraped during the run, then `tailguard doctor` on the folder.
2. Sweep: the gateway's `max_concurrency` over 2..32 on the discrete-event simulator, the same
   workload and clients, the default classes and policy (ranked-sjf, batch preemptible), against
   a chat P99 TTFT SLO; `make demo` runs the gateway at max_concurrency 8 (the engine's slots).
3. Doctor on each DES scenario of tests/unit/doctor/test_diagnosis.py (the rows of docs/tuning.md).

    .venv/bin/python benchmarks/seed_doctor.py [--duration 30] [--slo-ttft 0.5] [--requests 2000]

Writes benchmarks/results/seed_doctor/{before,sweep}/ and benchmarks/results/seed_doctor.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))  # the doctor scenarios live with their tests

from tailguard.bench.load import BenchConfig  # noqa: E402
from tailguard.bench.report import DOCTOR_FILE, bench_to_dir, load_run, rerender  # noqa: E402
from tailguard.bench.scrape import while_scraping  # noqa: E402
from tailguard.cli.doctor import snapshots  # noqa: E402
from tailguard.cli.experiment import Arm, SimSpec, target  # noqa: E402
from tailguard.cli.sweep import Plan, run_des  # noqa: E402
from tailguard.doctor.diagnosis import diagnose  # noqa: E402
from tailguard.doctor.pages import evidence  # noqa: E402
from tailguard.doctor.rules import findings_json  # noqa: E402
from tailguard.sweep.page import render  # noqa: E402
from tailguard.sweep.search import Setting, Slo, Sweep, parse_values, result  # noqa: E402


async def before(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    sim = SimSpec(max_num_seqs=8, time_scale=0.25)
    load = BenchConfig(url="", workload="seed-mixed", concurrency=16, duration_s=args.duration,
                       warmup_s=args.duration * 0.1, seed=0, time_scale=sim.time_scale)
    async with target(Arm("before"), sim, out / "logs") as url:
        cfg = BenchConfig(**{**load.__dict__, "url": url})
        await while_scraping(bench_to_dir(cfg, out, console=None, label="before"), [url], 1.0, out)
    records, meta = load_run(out)
    found = findings_json(diagnose(records, meta, evidence=evidence(snapshots(out))))
    (out / DOCTOR_FILE).write_text(json.dumps(found, indent=2) + "\n")
    rerender(out)
    return list(found["findings"])


def sweep(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    st = Setting.parse("max_concurrency")
    sw = Sweep(st, parse_values(st, "2..32:2"), [Slo("chat", "ttft_s", args.slo_ttft)], seed=0, max_repeats=5)
    gateway = {"backends": [{"name": "engine", "url": "http://127.0.0.1:1", "kind": "sim", "max_concurrency": 8}]}
    started = time.perf_counter()
    run_des(sw, Plan("seed-mixed", args.requests, 16, None, gateway, "h100-llama8b", 8, 1.0, out))
    res = result(sw)
    res["how"] = (f"DES, h100-llama8b with 8 slots, seed-mixed, 16 clients, {args.requests} requests per run; "
                  f"{time.perf_counter() - started:.0f} s for the whole sweep")
    page, pareto = render(res, res["how"])
    (out / "sweep.html").write_text(page)
    (out / "pareto.png").write_bytes(pareto)
    (out / "sweep.json").write_text(json.dumps(res, indent=2) + "\n")
    return res


def scenarios() -> dict[str, list[str]]:
    from tests.unit.doctor.test_diagnosis import SCENARIOS, findings

    return {name: [f"{f.kind}: {f.symptom}" for f in findings(vr)] for name, vr in SCENARIOS.items()}


def markdown(res: dict[str, Any]) -> str:
    lines = ["# The seed's before run, diagnosed; the max_concurrency sweep behind the fix", "",
             "`.venv/bin/python benchmarks/seed_doctor.py` (" + res["machine"] + ")", "",
             "## tailguard doctor on the before run (seed-mixed straight to the engine, 16 clients)", ""]
    for i, f in enumerate(res["before"], 1):
        lines += [f"{i}. **{f['kind']}** ({f['severity']}): {f['symptom']}", f"   - next: {f['next_step']}"]
    sw = res["sweep"]
    lines += ["", f"## Sweep of max_concurrency ({sw['how']})", "",
              f"SLO: chat P99 TTFT <= {sw['slo'][0]['bound_s']} s. Knee: **{sw['knee']}**; recommended: "
              f"**{sw['recommended']}** ({sw['reason']}).", "",
              "| max_concurrency | runs | output tok/s | chat P99 TTFT (s) | chat P99 E2E (s) | summary P99 E2E (s) | SLO |",
              "|---:|---:|---:|---:|---:|---:|:--|"]
    for p in sw["points"]:
        def v(c: str, m: str) -> str:
            x = p["p99"].get(c, {}).get(m, {}).get("mean")
            return "-" if x is None else f"{x:.3f}"
        lines.append(f"| {p['value']} | {p['runs']} | {p['throughput_tokens_per_s']:.0f} | {v('chat', 'ttft_s')} | "
                     f"{v('chat', 'e2e_s')} | {v('summary', 'e2e_s')} | {'ok' if p['meets_slo'] else 'miss'} |")
    lines += ["", "## Doctor on each DES scenario (docs/tuning.md)", ""]
    for name, found in res["scenarios"].items():
        lines.append(f"- `{name}`: " + ("; ".join(found) if found else "no problem found"))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30.0, help="wall seconds of the before run")
    ap.add_argument("--slo-ttft", type=float, default=0.5, help="chat P99 TTFT bound of the sweep (s)")
    ap.add_argument("--requests", type=int, default=2000, help="requests per DES run of the sweep")
    args = ap.parse_args()
    base = RESULTS / "seed_doctor"
    res: dict[str, Any] = {"machine": f"{platform.machine()}, Python {platform.python_version()}"}
    res["before"] = asyncio.run(before(args, base / "before"))
    res["sweep"] = sweep(args, base / "sweep")
    res["scenarios"] = scenarios()
    (RESULTS / "seed_doctor.json").write_text(json.dumps(res, indent=2) + "\n")
    (RESULTS / "seed_doctor.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
