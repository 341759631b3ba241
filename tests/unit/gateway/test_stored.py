"""Which backend holds each stored Response: remembered, bounded, oldest forgotten first."""

from __future__ import annotations

from tailguard.gateway.stored import ResponseHomes


def test_homes_are_remembered_within_their_bound() -> None:
    homes = ResponseHomes(capacity=2)
    homes.remember("resp_a", "gpu-a")
    homes.remember("resp_b", "gpu-b")
    homes.remember("resp_a", "gpu-a")  # used again: now the newest
    homes.remember("resp_c", "gpu-c")
    assert (homes.home("resp_a"), homes.home("resp_b"), homes.home("resp_c")) == ("gpu-a", None, "gpu-c")
    assert homes.home(None) is None and homes.home(7) is None
