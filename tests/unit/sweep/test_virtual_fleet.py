"""A DES run over the fleet a gateway config names: one simulated engine per backend, the
gateway's front routing between them, each request recorded with the backend that served it."""

from __future__ import annotations

from tailguard.bench.workload import parse_workload
from tailguard.config import GatewayConfig
from tailguard.sim.cost import EngineConfig
from tailguard.sweep.virtual import VirtualRun, run_virtual

ENGINE = EngineConfig.from_preset("h100-llama8b", max_num_seqs=4, max_model_len=2048, enable_prefix_caching=True)


def test_each_backend_of_the_config_is_an_engine_of_the_run() -> None:
    gw = GatewayConfig.model_validate({"backends": [
        {"name": n, "url": f"http://127.0.0.{i}:1", "kind": "sim", "max_concurrency": 2} for i, n in enumerate("abc")]})
    wl = parse_workload({"name": "w", "classes": [{"name": "chat", "prompt_tokens": 300, "max_tokens": 40}]})
    records, _, evidence = run_virtual(VirtualRun(ENGINE, wl, 60, gw, concurrency=6, seed=1))
    assert all(r.ok and r.output_tokens == 40 for r in records)
    served = {b: sum(r.backend == b for r in records) for b in "abc"}
    assert sum(served.values()) == 60 and min(served.values()) > 0  # six clients, two slots each
    assert evidence.running_max == 12.0 and evidence.prefix_queried_tokens == 60 * 300
