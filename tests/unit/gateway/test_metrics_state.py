"""What a scrape reads from the front and the config: caps, class bounds, counters at 0, the
config's identity; a class or config that has gone leaves no series behind."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams
from tailguard.config import GatewayConfig
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metrics import GatewayMetrics

CFG = GatewayConfig.model_validate({"backends": [{"name": "x", "url": "http://127.0.0.1:9"}]})


def _series(m: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(m.render().decode()) for s in fam.samples}


def test_a_scrape_sets_bounds_zeros_and_config_and_forgets_what_went() -> None:
    m = GatewayMetrics()
    both = Front(FrontParams([ClassSpec("chat", max_queue_wait_s=2.0), ClassSpec("bulk", rank=1)],
                             [BackendSpec("x", max_concurrency=6)]))
    m.export_state(both, Live(CFG, "aaaa", 1), 0.0)
    s = _series(m)
    assert s[("tailguard_class_queue_bound_seconds", (("class", "chat"),))] == 2.0
    assert s[("tailguard_rejected_total", (("class", "bulk"), ("reason", "queue_full")))] == 0
    assert s[("tailguard_retries_total", (("backend", "x"), ("kind", "connect")))] == 0
    assert s[("tailguard_config_info", (("hash", "aaaa"), ("number", "1")))] == 1
    assert s[("tailguard_capacity_ready", (("pool", "default"),))] == 1  # its one backend, not yet probed
    assert s[("tailguard_capacity_needed", (("pool", "default"),))] == 0  # nothing has run

    one = Front(FrontParams([ClassSpec("chat")], [BackendSpec("x")]))
    m.export_state(one, Live(CFG, "bbbb", 2), 1.0)
    s = _series(m)
    assert ("tailguard_class_queue_bound_seconds", (("class", "bulk"),)) not in s
    assert [k for k in s if k[0] == "tailguard_config_info"] == [
        ("tailguard_config_info", (("hash", "bbbb"), ("number", "2")))]
    assert not any(name.endswith("_created") for name, _ in s)
