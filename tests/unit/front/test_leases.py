"""The renewal pacing both drivers of shared slots follow (`front.leases`)."""

from __future__ import annotations

import pytest

from tailguard.front.leases import RenewalPacing, short


def test_the_first_look_renews_then_every_third_of_a_lease() -> None:
    pacing = RenewalPacing(lease_s=3.0)
    assert pacing.due(0.0, False)
    assert not pacing.due(0.05, False) and not pacing.due(0.99, False)
    assert pacing.due(1.0, False)  # a third of the lease on
    assert not pacing.due(1.5, False)


def test_falling_short_renews_at_once_and_restarts_the_period() -> None:
    pacing = RenewalPacing(lease_s=3.0)
    pacing.due(0.0, False)
    assert pacing.due(0.3, True)
    assert not pacing.due(1.0, False)  # the short renewal counts as the regular one
    assert pacing.due(1.3, False)


@pytest.mark.parametrize(("running", "waiting", "allotted", "held", "cap", "expected"), [
    (4, 0, 4, 4, 8, False),  # holds what it runs, nobody waits
    (4, 1, 4, 4, 8, True),  # a request waits and the replica holds less than the cap
    (8, 1, 8, 8, 8, False),  # it waits for the replica's own requests to end: more would be over the cap
    (2, 0, 4, 4, 8, True),  # holds two slots it no longer uses: another replica may wait for them
    (2, 0, 2, 2, 8, False),  # what it holds is what it runs
])
def test_short(running: int, waiting: int, allotted: int, held: int, cap: int, expected: bool) -> None:
    assert short(running, waiting, allotted, held, cap) is expected
