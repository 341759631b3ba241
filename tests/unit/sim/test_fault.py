import pytest

from tailguard.errors import ConfigError
from tailguard.sim.fault import ErrorSpread, Faults


def fails(rate: float, n: int, after_s: float = 0.0, at: float = 0.0) -> list[bool]:
    spread = ErrorSpread(Faults(error_rate=rate, errors_after_s=after_s))
    return [spread.fails(at) for _ in range(n)]


def test_an_error_rate_fails_exactly_that_share_evenly_spread() -> None:
    assert fails(0.0, 4) == [False] * 4
    assert fails(1.0, 4) == [True] * 4
    assert fails(0.5, 6) == [False, True] * 3
    assert fails(0.25, 8) == [False, False, False, True] * 2
    assert sum(fails(0.1, 1000)) == 100 and sum(fails(0.3, 10)) == 3


def test_errors_start_after_their_instant_and_count_from_there() -> None:
    spread = ErrorSpread(Faults(error_rate=0.5, errors_after_s=10.0))
    assert [spread.fails(t) for t in (0.0, 5.0, 9.9)] == [False] * 3
    assert [spread.fails(t) for t in (10.0, 11.0, 12.0, 13.0)] == [False, True, False, True]


def test_which_requests_hang() -> None:
    assert Faults(hang="hang").hangs(completion=False) and Faults(hang="hang").hangs(completion=True)
    assert Faults(hang="hang-completions").hangs(completion=True)
    assert not Faults(hang="hang-completions").hangs(completion=False)
    assert not Faults().hangs(completion=True)


@pytest.mark.parametrize("kw", [{"hang": "explode"}, {"error_rate": 1.5}, {"error_rate": -0.1},
                                {"errors_after_s": -1.0}])
def test_bad_faults_are_config_errors(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Faults(**kw)  # type: ignore[arg-type]
