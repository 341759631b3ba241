"""The engine fit on served requests made from a known model: it finds the level it was made at,
tells the prefill rate from a fixed cost only when prompts vary, and keeps the shape's level
when there is nothing to read."""

from __future__ import annotations

import random

import pytest

from tailguard.sim.cost import H100_LLAMA8B, CostModel
from tailguard.sim.fit import Served, fit

TRUE = CostModel(H100_LLAMA8B.a_s * 0.25, H100_LLAMA8B.b_s_per_prefill_token * 0.25,
                 H100_LLAMA8B.c_s_per_decode_seq * 0.25, H100_LLAMA8B.d_s_per_kv_token * 0.25)
OVERHEAD_S = 0.003


def served(rng: random.Random, prompts: tuple[int, int], n: int = 300) -> list[Served]:
    out = []
    for _ in range(n):
        p = rng.randint(*prompts)
        seqs, kv = rng.uniform(1, 8), rng.uniform(1000, 20000)
        others, others_kv = max(0.0, seqs - 1), kv * 0.8
        base = TRUE.step_time(0, others, others_kv)
        waited = 0.5 * base if others >= 0.5 else 0.0
        prefill = waited + base + TRUE.b_s_per_prefill_token * p + OVERHEAD_S
        out.append(Served(p, 100, prefill, TRUE.step_time(0, seqs, kv), seqs, kv, others, others_kv))
    return out


def test_varied_prompts_give_the_decode_level_the_prefill_rate_and_the_fixed_cost() -> None:
    f = fit(H100_LLAMA8B, served(random.Random(1), (50, 4000)))
    assert f.decode_scale == pytest.approx(0.25)
    assert f.prefill_from_prompts and f.prefill_scale == pytest.approx(0.25)
    assert f.overhead_s == pytest.approx(OVERHEAD_S)
    assert f.cost.a_s == pytest.approx(TRUE.a_s) and f.cost.d_s_per_kv_token == pytest.approx(TRUE.d_s_per_kv_token)
    assert (f.decode_samples, f.prefill_samples) == (300, 300)


def test_alike_prompts_cannot_tell_the_rate_from_the_fixed_cost_so_prefill_takes_the_decode_level() -> None:
    f = fit(H100_LLAMA8B, served(random.Random(2), (100, 180)))
    assert not f.prefill_from_prompts
    assert f.prefill_scale == pytest.approx(f.decode_scale) and f.decode_scale == pytest.approx(0.25)
    assert f.overhead_s == pytest.approx(OVERHEAD_S, abs=1e-4)


def test_nothing_to_read_keeps_the_shape() -> None:
    f = fit(H100_LLAMA8B, [])
    assert f.cost == H100_LLAMA8B and f.overhead_s == 0.0 and f.decode_samples == f.prefill_samples == 0
