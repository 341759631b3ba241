"""The simulated card's DCGM readings from the steps it ran: busy time in the last second, SM
activity as the batch's fill, memory from weights and KV, power and clocks from load, a throttle."""

from __future__ import annotations

import pytest

from tailguard.sim.gpu import A100_80GB, H100_80GB, POWER_BUSY, POWER_FILL, GpuMeter


def steps(meter: GpuMeter, start: float, n: int, duration: float, fill: float, share: float = 1.0,
          gap: float = 0.0) -> float:
    t = start
    for _ in range(n):
        meter.step(t, duration, fill, share)
        t += duration + gap
    return t


def test_an_idle_card() -> None:
    r = GpuMeter(H100_80GB).read(5.0, kv_tokens=0, working=False)
    assert (r.util_pct, r.sm_active, r.power_w, r.sm_clock_mhz) == (0, 0.0, 70.0, 345)
    assert r.fb_used_mib == round(15_316 + 3_072) and r.fb_used_mib + r.fb_free_mib == pytest.approx(81_559, abs=1)


def test_busy_half_the_second_with_a_half_full_batch() -> None:
    meter = GpuMeter(H100_80GB)
    end = steps(meter, 0.0, 50, 0.01, 0.5, gap=0.01)  # 10 ms steps, 10 ms apart: busy half the time
    r = meter.read(end, kv_tokens=10_000, working=False)
    assert r.util_pct == pytest.approx(50, abs=1) and r.gr_engine_active == pytest.approx(0.5, abs=0.01)
    assert r.sm_active == pytest.approx(0.25, abs=0.01)
    assert r.power_w == pytest.approx(70 + 630 * (POWER_BUSY * 0.5 + POWER_FILL * 0.25), abs=5)
    assert r.sm_clock_mhz == 1980 and r.power_limit_w == 700 and r.max_sm_clock_mhz == 1980
    assert r.fb_used_mib == round(15_316 + 3_072 + 10_000 * 131_072 / 2**20)  # 1,250 MiB of KV


def test_between_two_steps_a_working_card_is_busy() -> None:
    meter = GpuMeter(A100_80GB)
    end = steps(meter, 0.0, 100, 0.01, 1.0)
    assert meter.read(end + 0.005, 0, working=True).util_pct == 100
    assert meter.read(end + 0.5, 0, working=False).util_pct == 50  # idle for the last half second
    meter.extend(end + 0.5)  # a simulator that fell behind: the lost time was the card's work
    assert meter.read(end + 0.5, 0, working=False).util_pct == 100


def test_a_card_held_down_shows_lower_clocks_and_its_power_limit() -> None:
    meter = GpuMeter(H100_80GB)
    end = steps(meter, 0.0, 100, 0.01, 0.1, share=0.4)
    r = meter.read(end, 0, working=True)
    assert r.sm_clock_mhz == round(1980 * 0.4) and r.power_w == 700
    half = steps(meter, end, 50, 0.01, 0.1)  # the next half second at full clocks
    mixed = meter.read(half, 0, working=True)
    assert mixed.sm_clock_mhz == pytest.approx(1980 * 0.7, abs=2) and 70 < mixed.power_w < 700
