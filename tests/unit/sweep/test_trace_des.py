"""A trace on the discrete-event simulator: the prefix cache finds the reuse the trace has (its
blocks become shared text, keyed as the simulator keys what the bench sends), and a run keeps
the trace's arrivals, sizes and classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.bench.stats import summarize
from tailguard.bench.trace.blocks import block_reuse
from tailguard.bench.trace.plan import TraceSpec, load_replay
from tailguard.clock import VirtualClock
from tailguard.config import GatewayConfig
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Arrival
from tailguard.sweep.virtual import VirtualRun, run_virtual, trace_planned

DATA = Path(__file__).resolve().parents[2] / "data"


def unbounded(**kw: object) -> EngineConfig:
    return EngineConfig.from_preset("h100-llama8b", enable_prefix_caching=True, kv_cache_tokens=20_000_000,
                                    max_model_len=16384, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("speed", [1.0, 20.0])
def test_the_simulator_s_prefix_hits_are_the_trace_s_block_reuse(speed: float) -> None:
    """Mooncake's hash_ids as shared text: with a cache that never evicts, the simulated engine
    reuses what the trace says was reused (20x as fast, requests that share a prefix overlap
    in the engine, and still find it)."""
    replay = load_replay(TraceSpec(str(DATA / "mooncake_500.jsonl"), speed=speed))
    engine = unbounded()
    planned = trace_planned(replay, engine)
    assert all(p.block_hashes for p in planned)
    e = Engine(engine)
    run(e, [Arrival(p.id, p.at, p.prompt_tokens, p.max_tokens, block_hashes=p.block_hashes) for p in planned],
        VirtualClock())
    hit = e.prefix_hit_tokens_total / e.prefix_queried_tokens_total
    reuse = block_reuse(replay.requests, 512)
    assert reuse is not None and reuse > 0.5
    assert hit == pytest.approx(reuse, abs=0.02)


def test_a_trace_without_blocks_shares_nothing() -> None:
    replay = load_replay(TraceSpec(str(DATA / "azure_conv_500.csv"), limit=100))
    assert not any(p.block_hashes for p in trace_planned(replay, unbounded()))


def test_a_des_run_replays_the_trace_s_arrivals_sizes_and_classes(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("classes:\n  - name: api\n    when: {Log Type: API log}\n    headers: {X-Tailguard-Class: batch}\n"
                     "  - name: chat\n    headers: {X-Tailguard-Class: interactive}\n")
    replay = load_replay(TraceSpec(str(DATA / "burstgpt_500.csv"), speed=2.0, rules=str(rules)))
    gateway = GatewayConfig.model_validate({"backends": [
        {"name": f"e{i}", "url": "http://127.0.0.1:1", "kind": "sim", "max_concurrency": 8} for i in range(2)]})
    records, meta, _ = run_virtual(VirtualRun.of_trace(EngineConfig.from_preset("h100-llama8b", max_num_seqs=8),
                                                       replay, gateway))
    assert len(records) == 500 and all(r.ok for r in records)
    by_index = sorted(records, key=lambda r: r.scheduled_at)
    assert [r.scheduled_at for r in by_index] == pytest.approx([r.at for r in replay.requests])
    assert by_index[-1].scheduled_at == pytest.approx(116.0 / 2.0)  # the trace's span at twice its rate
    assert sorted(r.output_tokens for r in records) == sorted(max(1, r.output_tokens) for r in replay.requests)
    assert sorted(r.prompt_tokens for r in records) == sorted(max(5, r.input_tokens) for r in replay.requests)
    assert {r.cls: r.server_class for r in records} == {"api": "batch", "chat": "interactive"}
    s = summarize(records, meta)
    per_class = {c: sum(r.value("Log Type") == ("API log" if c == "api" else "Conversation log")
                        for r in replay.requests) for c in ("api", "chat")}
    assert s["trace"]["classes"] == per_class == {c: g["count"] for c, g in s["classes"].items()}
    assert s["overall"]["lengths"]["output_tokens"]["max"] == max(r.output_tokens for r in replay.requests)
