"""Staged deadlines and the learned speed, driven with literal instants."""

from __future__ import annotations

import math

import pytest

from tailguard.client.timeouts import Deadlines, Expired, Speed, Timeouts


def test_first_token_then_idle_then_total() -> None:
    d = Deadlines(first_token_s=30, idle_s=15, total_s=100, sent_at=0.0)
    assert d.next_at() == 30
    assert d.expired(29.9) is None
    assert d.expired(30.0) == Expired("first_token", 30, 30.0)
    d.on_content(20.0)
    assert d.next_at() == 35  # idle now, counted from the content
    d.on_content(34.0, chunks=3)
    assert d.content_chunks == 4 and d.first_content_at == 20.0
    assert d.expired(48.9) is None
    assert d.expired(49.5) == Expired("idle", 15, 15.5)
    d.on_content(90.0)
    assert d.next_at() == 100
    assert d.expired(100.0) == Expired("total", 100, 100.0)


def test_phases_switched_off() -> None:
    d = Deadlines(first_token_s=None, idle_s=None, total_s=None, sent_at=0.0)
    assert d.next_at() is None and d.remaining_s(1e9) == math.inf and d.expired(1e9) is None
    d = Deadlines(first_token_s=None, idle_s=5, total_s=None, sent_at=0.0)
    assert d.next_at() is None  # idle starts with the first content
    d.on_content(100.0)
    assert d.remaining_s(101.0) == 4.0


def test_total_derived_from_max_tokens_and_speed() -> None:
    t = Timeouts(first_token=30, tokens_per_s=10, slack=2)
    assert t.total_s(max_tokens=None, learned_tokens_per_s=None) is None
    assert t.total_s(max_tokens=300, learned_tokens_per_s=None) == (30 + 30) * 2
    assert t.total_s(max_tokens=300, learned_tokens_per_s=100) == (30 + 3) * 2
    assert Timeouts(total=7).total_s(max_tokens=10_000, learned_tokens_per_s=1) == 7


def test_timeouts_reject_nonsense() -> None:
    for bad in ({"connect": 0}, {"idle": -1}, {"tokens_per_s": 0}, {"slack": 0.5}):
        with pytest.raises(ValueError):
            Timeouts(**bad)  # type: ignore[arg-type]


def test_speed_answers_a_slow_recent_figure_once_it_has_enough() -> None:
    s = Speed(window=10, quantile=0.1, min_samples=3)
    s.observe(tokens=101, seconds=1.0)
    s.observe(tokens=51, seconds=1.0)
    assert s.tokens_per_s() is None
    s.observe(tokens=1, seconds=1.0)  # one token says nothing about speed
    s.observe(tokens=201, seconds=0.0)
    assert s.tokens_per_s() is None
    s.observe(tokens=21, seconds=1.0)
    assert s.tokens_per_s() == 20.0
    for _ in range(10):
        s.observe(tokens=401, seconds=1.0)  # the slow ones leave the window
    assert s.tokens_per_s() == 400.0
