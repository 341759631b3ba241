"""What doctor reads from a DCGM exporter's and a node-exporter's pages: per GPU and per host, over
the snapshots taken while the run ran, clocks and power over the busy ones."""

from __future__ import annotations

import pytest

from tailguard.doctor.hardware import gpu_evidence, host_evidence
from tailguard.doctor.metrics import parse
from tailguard.doctor.pages import sort_pages
from tailguard.wire import dcgm
from tests.unit.doctor.pages import DEFAULT_COUNTERS, evidence_of, snaps


def dcgm_page(util: tuple[float, float], clock: tuple[float, float], violation: float = 0.0) -> str:
    """Two GPUs of one node as dcgm-exporter writes them (`render_metrics.go`: gpu, UUID,
    pci_bus_id, device, modelName, hostname), default counters plus the power-violation counter."""
    out = []
    for name, values in ((dcgm.GPU_UTIL, util), (dcgm.SM_CLOCK, clock), (dcgm.FB_USED, (60_000, 20_000)),
                         (dcgm.FB_FREE, (21_559, 61_559)), (dcgm.POWER_USAGE, (650.0, 120.0)),
                         (dcgm.POWER_VIOLATION, (violation, 0.0))):
        out.append(f"# TYPE {name} gauge")
        for gpu, v in enumerate(values):
            out.append(f'{name}{{gpu="{gpu}",UUID="GPU-{gpu}",pci_bus_id="00000000:0{gpu}:00.0",device="nvidia{gpu}",'
                       f'modelName="NVIDIA H100 80GB HBM3",hostname="node-7"}} {v}')
    return "\n".join(out) + "\n"


def test_a_page_of_two_gpus_gives_two_and_reads_clocks_only_while_busy() -> None:
    pages = [dcgm_page((0, 0), (345, 345)), dcgm_page((100, 20), (1980, 1980)),
             dcgm_page((97, 30), (1500, 345), violation=2e9), dcgm_page((0, 0), (345, 345), violation=2e9)]
    first, second = gpu_evidence("http://10.0.0.7:9400/metrics", [parse(p) for p in pages])
    assert (first.name, second.name) == ("node-7 gpu 0", "node-7 gpu 1")
    assert first.model == "NVIDIA H100 80GB HBM3" and first.snapshots == 2  # the first and last are the run's ends
    assert first.util == pytest.approx(0.985) and first.activity_of == dcgm.GPU_UTIL and first.busy_time_only
    # busy snapshots only: the idle card's 345 MHz is no throttle; the reference is the highest it ran at
    assert (first.clock_min_mhz, first.clock_ref_mhz, first.clock_ref_of) == (1500, 1980, "the highest it ran at")
    assert first.clock_drop == pytest.approx(1 - 1500 / 1980)
    assert first.violations == 2e9 and second.violations == 0.0
    assert first.fb_share == pytest.approx(60_000 / 81_559) and first.power_share is None  # no limit on the page
    assert second.clock_min_mhz is None  # never busy: nothing to say of its clocks


def test_the_simulators_pages_hold_an_engine_and_a_gpu() -> None:
    ev = evidence_of("sim-saturated")
    (g,) = ev.gpus
    assert g.name == "tailguard-sim gpu 0" and g.model == "NVIDIA A100-SXM4-80GB"
    assert g.activity_of == dcgm.SM_ACTIVE and not g.busy_time_only and (g.activity or 0) > 0.8
    assert g.clock_ref_of == dcgm.MAX_SM_CLOCK and g.clock_drop == 0.0 and g.power_limit_w == 400.0
    calm, held = evidence_of("sim-calm").gpus[0], evidence_of("sim-throttled").gpus[0]
    assert (calm.activity or 1) < 0.5 and calm.clock_drop == 0.0
    assert (held.clock_drop or 0) >= 0.4 and (held.power_share or 0) > 0.97


def test_default_counters_say_busy_time_only() -> None:
    (g,) = evidence_of("sim-saturated", only=DEFAULT_COUNTERS).gpus
    assert g.activity_of == dcgm.GR_ENGINE_ACTIVE and g.busy_time_only
    assert g.power_limit_w is None and g.clock_ref_of == "the highest it ran at"


def test_host_pages() -> None:
    (busy,) = evidence_of("node-busy").hosts
    assert busy.cpus == 2 and (busy.cpu_busy or 0) > 0.9 and busy.swapped_pages == 0
    (calm,) = evidence_of("node-calm").hosts
    assert calm.cpus == 8 and calm.cpu_busy == pytest.approx(0.2) and calm.swap_used_max_bytes == 0
    (swapping,) = evidence_of("node-swapping").hosts
    assert swapping.swapped_pages == 3 * 4000 * 3 and (swapping.mem_available_min or 1) < 0.02


def test_pages_are_sorted_by_role_or_by_what_they_hold() -> None:
    url, role, host = snaps("node-calm")
    _, _, gpu = snaps("sim-calm")
    pages = sort_pages({url: (role, host), "http://sim:8000/metrics": (None, gpu),
                        "http://exporter:9400/metrics": ("gpu", [{}])})
    assert list(pages.hosts) == [url] and list(pages.gpus) == ["http://sim:8000/metrics", "http://exporter:9400/metrics"]
    assert host_evidence(url, [{}]) is None  # a page said to be a host's that holds no CPU counters says nothing
