"""The online TTFT fit (`front.latency`): on plain numbers, and against the simulator's own cost
model on virtual time (the front drives the DES's engine and learns from its first tokens)."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence

import pytest

from tailguard.clock import VirtualClock
from tailguard.front.events import Decision, Event, Start, StartMode
from tailguard.front.front import Front
from tailguard.front.latency import MIN_SAMPLES, TtftFit
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, Slo
from tailguard.sim.cost import EngineConfig
from tailguard.sim.des import run
from tailguard.sim.engine import Engine
from tailguard.sim.scenario import Arrival


def test_exact_linear_samples_give_back_their_coefficients() -> None:
    fit = TtftFit()
    rng = random.Random(3)
    for _ in range(400):
        p, r, c = rng.uniform(0, 4000), rng.randint(0, 32), rng.uniform(0, 60_000)
        fit.observe(p, r, c, 0.016 + 48e-6 * p + 0.002 * r + 0.1e-6 * c)
    coef = fit.coefficients()
    assert coef is not None
    assert coef.a_s == pytest.approx(0.016, rel=0.02)
    assert coef.b_s_per_prefill_token == pytest.approx(48e-6, rel=0.01)
    assert coef.c_s_per_running == pytest.approx(0.002, rel=0.02)
    assert coef.d_s_per_context_token == pytest.approx(0.1e-6, rel=0.05)


def test_nothing_is_predicted_before_enough_samples() -> None:
    fit = TtftFit()
    for i in range(MIN_SAMPLES - 1):
        fit.observe(100.0 * i, 1, 1000, 0.01 + 0.0001 * i)
        assert fit.predict(100, 1, 1000) is None
    fit.observe(0, 1, 1000, 0.01)
    assert fit.predict(100, 1, 1000) is not None


def test_a_term_that_would_come_out_negative_is_left_out() -> None:
    """More running requests never make a first token come sooner, whatever the noise says."""
    fit = TtftFit()
    rng = random.Random(5)
    for _ in range(300):
        p, r = rng.uniform(0, 2000), rng.randint(0, 16)
        fit.observe(p, r, 0.0, 0.02 + 50e-6 * p - 0.001 * r)  # a falsely negative running term
    coef = fit.coefficients()
    assert coef is not None and coef.c_s_per_running == 0.0 and coef.b_s_per_prefill_token > 0


def test_a_backend_that_slows_down_is_followed() -> None:
    """Old samples are forgotten: after the engine becomes three times slower, the fit follows."""
    fit = TtftFit()
    rng = random.Random(9)
    for slow in (1.0, 3.0):
        for _ in range(1500):
            p = rng.uniform(0, 3000)
            fit.observe(p, 4, 5000, slow * (0.02 + 40e-6 * p))
    got = fit.predict(1000, 4, 5000)
    assert got == pytest.approx(3.0 * (0.02 + 40e-6 * 1000), rel=0.05)


# --- against the simulator's cost model -------------------------------------------------------------

PROMPTS = (100, 500, 1000, 2000, 4000)


def _sweep(rate: float, n: int, seed: int) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """One engine (A100 preset, 32 sequences) behind a front that learns TTFT, at `rate` requests
    per second; per prompt size, the TTFT predicted at each start (by the fit as it stood then) and
    the TTFT the engine gave from that start."""
    cfg = EngineConfig.from_preset("a100-llama8b", max_num_seqs=32)
    params = FrontParams(classes=[ClassSpec("interactive", max_queue_wait_s=1e6, slo=Slo(ttft_s=1e6))],
                         backends=[BackendSpec("engine", max_concurrency=32)])
    front = Front(params)
    rng = random.Random(seed)
    t = 0.0
    arrivals = []
    for i in range(n):
        t += rng.expovariate(rate)
        arrivals.append(Arrival(f"r{i}", t, rng.choice(PROMPTS), rng.choice((16, 64, 256))))
    predicted: dict[str, float] = {}

    def tap(event: Event, now: float, preempt: bool, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Start) and d.mode is StartMode.FRESH:
                p = front.predicted_ttft_s(d.id)
                if p is not None:
                    predicted[d.id] = p

    timelines = run(Engine(cfg), arrivals, VirtualClock(), front, tap=tap)
    got: dict[int, list[float]] = defaultdict(list)
    want: dict[int, list[float]] = defaultdict(list)
    for tl in timelines[n // 5:]:  # after a warm-up
        if tl.id in predicted and tl.first_token_at is not None and tl.dispatched_at is not None:
            got[tl.prompt_tokens].append(predicted[tl.id])
            want[tl.prompt_tokens].append(tl.first_token_at - tl.dispatched_at)
    return got, want


@pytest.mark.parametrize("rate", [2.0, 6.0, 12.0])
def test_the_fit_predicts_the_simulators_ttft_within_15_percent(rate: float) -> None:
    """Over a sweep of prompt sizes and loads (light to a full batch of 32), the mean TTFT the fit
    predicted at each start is within 15% of the mean the engine model gave."""
    got, want = _sweep(rate, 1500, seed=int(rate))
    assert set(got) == set(PROMPTS)
    for prompt in PROMPTS:
        mean_got = sum(got[prompt]) / len(got[prompt])
        mean_want = sum(want[prompt]) / len(want[prompt])
        assert mean_got == pytest.approx(mean_want, rel=0.15), (rate, prompt, mean_got, mean_want)


def test_the_fitted_prefill_rate_is_the_simulators() -> None:
    """The prefill term the front learns is the engine model's own `b` (48 us a token, A100)."""
    cfg = EngineConfig.from_preset("a100-llama8b", max_num_seqs=32)
    params = FrontParams(classes=[ClassSpec("interactive", max_queue_wait_s=1e6, slo=Slo(ttft_s=1e6))],
                         backends=[BackendSpec("engine", max_concurrency=32)])
    front = Front(params)
    rng = random.Random(2)
    t = 0.0
    arrivals = []
    for i in range(1500):
        t += rng.expovariate(6.0)
        arrivals.append(Arrival(f"r{i}", t, rng.choice(PROMPTS), rng.choice((16, 64, 256))))
    run(Engine(cfg), arrivals, VirtualClock(), front)
    coef = front.latency("engine")
    assert coef is not None
    assert coef.b_s_per_prefill_token == pytest.approx(cfg.cost.b_s_per_prefill_token, rel=0.15)
