"""Where the generator's loop stalls went: the kernel's scheduler statistics read, added up per
stall, and summed over a spread run's workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.bench.stalls import SchedClock, Stalls, merged


def test_the_clock_reads_seconds_on_a_cpu_and_waiting_for_one(tmp_path: Path) -> None:
    stat = tmp_path / "schedstat"
    stat.write_text("1500000000 250000000 42\n")
    clock = SchedClock(str(stat))
    assert clock.read() == (1.5, 0.25)
    stat.write_text("garbage\n")
    assert clock.read() is None
    clock.close()
    assert clock.read() is None
    assert SchedClock(str(tmp_path / "absent")).read() is None


def test_this_threads_own_statistics_grow_as_it_runs() -> None:
    clock = SchedClock()
    first = clock.read()
    if first is None:
        pytest.skip("this kernel keeps no scheduler statistics (/proc/thread-self/schedstat)")
    sum(i * i for i in range(300_000))
    second = clock.read()
    assert second is not None and second[0] > first[0] and second[1] >= first[1]
    clock.close()


def test_stalls_add_up_and_a_spread_run_sums_its_workers() -> None:
    s = Stalls(measured=True)
    s.add(0.2, 0.19, (1.0, 2.0), (1.01, 2.15))
    s.add(0.1, 0.09, None, (1.0, 2.0))  # a read that failed is not counted
    s.add(0.1, 0.09, (1.01, 2.15), (1.09, 2.16))
    d = s.as_dict()
    assert d["count"] == 2 and d["wall_s"] == 0.3 and d["late_s"] == 0.28
    assert d["running_s"] == 0.09 and d["waiting_s"] == 0.16
    assert merged([d, d])["count"] == 4 and merged([d, d])["waiting_s"] == 0.32  # type: ignore[index]
    assert merged([d, None]) is None and merged([]) is None
