import pytest

from tailguard.clock import ScaledClock, VirtualClock


def test_scaled_clock_runs_faster_at_small_scale() -> None:
    t = [100.0]
    c = ScaledClock(time_scale=0.1, source=lambda: t[0])
    t[0] = 101.0
    assert c.now() == pytest.approx(10.0)
    assert c.wall_delay(20.0) == pytest.approx(1.0)
    assert c.wall_delay(5.0) == 0.0


def test_virtual_clock_only_moves_forward() -> None:
    c = VirtualClock()
    c.advance_to(3.0)
    assert c.now() == 3.0
    with pytest.raises(ValueError):
        c.advance_to(2.0)
