"""A seeded sweep of the gateway's max_concurrency on the discrete-event simulator finds the knee
the engine's cost model predicts, and runs the same twice."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tailguard.bench.workload import parse_workload
from tailguard.cli.sweep import Plan, run_des
from tailguard.sim.cost import EngineConfig
from tailguard.sweep.search import Setting, Sweep, knee, parse_values, result

SLOTS = 8
DECODE = {"name": "decode", "classes": [{"name": "chat", "prompt_tokens": 64, "max_tokens": 256}]}


def predicted_tokens_per_s(n: int, cfg: EngineConfig) -> float:
    """The cost model's decode throughput with min(n, max_num_seqs) sequences in the batch, each
    reading on average its prompt plus half its output from the KV cache, each prompt prefilled once."""
    m = min(n, cfg.max_num_seqs)
    c = cfg.cost
    step = c.a_s + c.c_s_per_decode_seq * m + c.d_s_per_kv_token * m * (64 + 128)
    per_request = 256 * step + c.b_s_per_prefill_token * 64  # a prompt's prefill delays its batch once
    return m * 256 / per_request


def sweep(tmp: Path, values: str = "2..32:2") -> dict[str, object]:
    setting = Setting.parse("max_concurrency")
    sw = Sweep(setting, parse_values(setting, values), [], seed=5, min_repeats=1, max_repeats=1)
    # clients wait as long as it takes: a closed loop measures capacity, not admission
    gateway = {"backends": [{"name": "engine", "url": "http://127.0.0.1:1", "kind": "sim", "max_concurrency": SLOTS}],
               "classes": [{"name": "interactive", "max_queue_wait_s": 3600}]}
    tmp.mkdir(parents=True, exist_ok=True)
    wl = tmp / "decode.yaml"
    wl.write_bytes(orjson.dumps(DECODE))
    run_des(sw, Plan(str(wl), 120, 32, None, gateway, "h100-llama8b", SLOTS, 1.0, tmp / "out"))
    return result(sw)


def test_the_knee_is_where_the_cost_model_puts_it(tmp_path: Path) -> None:
    parse_workload(DECODE)
    res = sweep(tmp_path)
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=SLOTS)
    values = res["values"]
    assert isinstance(values, list)
    predicted = [predicted_tokens_per_s(v, cfg) for v in values]
    measured = [p["throughput_tokens_per_s"] for p in res["points"]]  # type: ignore[attr-defined]
    expected = knee([float(v) for v in values], predicted)
    assert expected is not None and values[expected] == SLOTS
    assert res["knee"] == values[expected]
    for v, m, p in zip(values, measured, predicted):
        assert m == pytest.approx(p, rel=0.05), v
    assert len(list((tmp_path / "out").glob("max_concurrency=*/seed5/summary.json"))) == len(values)


def test_seeded_and_reproducible(tmp_path: Path) -> None:
    assert sweep(tmp_path / "a", "2..32:x2") == sweep(tmp_path / "b", "2..32:x2")
