import pytest

from tailguard.errors import ConfigError
from tailguard.sim.fault import ErrorSpread, Faults


def fails(rate: float, n: int, after_s: float = 0.0, at: float = 0.0) -> list[bool]:
    spread = ErrorSpread(Faults(error_rate=rate, after_s=after_s))
    return [spread.fails(at) for _ in range(n)]


def test_an_error_rate_fails_exactly_that_share_evenly_spread() -> None:
    assert fails(0.0, 4) == [False] * 4
    assert fails(1.0, 4) == [True] * 4
    assert fails(0.5, 6) == [False, True] * 3
    assert fails(0.25, 8) == [False, False, False, True] * 2
    assert sum(fails(0.1, 1000)) == 100 and sum(fails(0.3, 10)) == 3


def test_errors_start_after_their_instant_and_count_from_there() -> None:
    spread = ErrorSpread(Faults(error_rate=0.5, after_s=10.0))
    assert [spread.fails(t) for t in (0.0, 5.0, 9.9)] == [False] * 3
    assert [spread.fails(t) for t in (10.0, 11.0, 12.0, 13.0)] == [False, True, False, True]


def test_which_requests_hang_and_when_the_engine_stalls() -> None:
    assert Faults(fault="hang").hangs(False, 0.0) and Faults(fault="hang").hangs(True, 0.0)
    assert Faults(fault="hang-completions").hangs(True, 0.0)
    assert not Faults(fault="hang-completions").hangs(False, 0.0)
    assert not Faults().hangs(True, 0.0) and not Faults(fault="stall").hangs(True, 0.0)
    later = Faults(fault="hang", after_s=7.0)
    assert not later.hangs(True, 6.9) and later.hangs(True, 7.0)
    assert not Faults(fault="stall", after_s=3.0).stalls(2.0) and Faults(fault="stall", after_s=3.0).stalls(3.0)
    assert not Faults(fault="hang").stalls(10.0)


def test_a_throttled_card_is_held_down_two_seconds_in_four_from_its_start() -> None:
    held = Faults(throttle=0.4, after_s=10.0)
    assert [held.clock_share(t) for t in (0.0, 9.9, 10.0, 11.9, 12.0, 13.9, 14.0, 16.5)] == \
        [1.0, 1.0, 1.0, 1.0, 0.4, 0.4, 1.0, 0.4]
    assert Faults().clock_share(3.0) == 1.0
    assert not held.misbehaves and Faults(error_rate=0.1).misbehaves  # a throttle answers every request


@pytest.mark.parametrize("kw", [{"fault": "explode"}, {"error_rate": 1.5}, {"error_rate": -0.1},
                                {"after_s": -1.0}, {"throttle": 0.0}, {"throttle": 1.5}])
def test_bad_faults_are_config_errors(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Faults(**kw)  # type: ignore[arg-type]
