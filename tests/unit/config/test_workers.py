"""`per_worker`: each of N workers gets 1/N of every shared cap, and nothing else changes."""

from __future__ import annotations

from tailguard.config import GatewayConfig
from tailguard.config.workers import per_worker


def _cfg() -> GatewayConfig:
    return GatewayConfig.model_validate({
        "backends": [{"name": "a", "url": "http://127.0.0.1:1", "max_concurrency": 9, "reserved_slots": 2,
                      "adaptive": {"min": 2, "max": 16}},
                     {"name": "b", "url": "http://127.0.0.1:2", "max_concurrency": 1}],
        "auth": {"api_keys": {"k1": {"rpm_limit": 600, "tpm_limit": 1000, "max_parallel_requests": 8}, "k2": {}}},
        "limits": {"max_connections": 1000, "max_queued_body_bytes": 1 << 20},
        "max_body_bytes": 12345,
    })


def test_every_shared_cap_is_divided_rounded_down_and_at_least_one() -> None:
    w = per_worker(_cfg(), 2)
    a, b = w.backends
    assert (a.max_concurrency, a.reserved_slots, b.max_concurrency) == (4, 1, 1)
    assert a.adaptive is not None and (a.adaptive.min, a.adaptive.max) == (1, 8)
    assert (w.auth.api_keys["k1"].rpm_limit, w.auth.api_keys["k1"].tpm_limit) == (300, 500)
    assert w.auth.api_keys["k1"].max_parallel_requests == 4
    assert w.auth.api_keys["k2"].rpm_limit is None
    assert [c.max_queue_len for c in w.classes] == [c.max_queue_len // 2 for c in _cfg().classes]
    assert (w.limits.max_connections, w.limits.max_queued_body_bytes) == (500, 1 << 19)


def test_per_request_bounds_are_not_shares_and_one_worker_is_the_config_itself() -> None:
    cfg = _cfg()
    assert per_worker(cfg, 3).max_body_bytes == 12345
    assert per_worker(cfg, 3).limits.max_event_bytes == cfg.limits.max_event_bytes
    assert per_worker(cfg, 1) is cfg


def test_with_shared_state_slots_and_callers_limits_stay_whole_for_redis_to_share() -> None:
    cfg = _cfg().model_copy(update={"state": _cfg().state.model_copy(update={"url": "redis://127.0.0.1:6379"})})
    w = per_worker(cfg, 2)
    assert [b.max_concurrency for b in w.backends] == [9, 1]  # one count over every process, in Redis
    assert (w.auth.api_keys["k1"].rpm_limit, w.auth.api_keys["k1"].tpm_limit) == (600, 1000)
    assert w.auth.api_keys["k1"].max_parallel_requests == 8
    assert w.limits.max_connections == 500  # one host's own bounds are still divided
