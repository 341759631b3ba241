"""What the GPUs and hosts said during a run, per GPU and per host, from the pages of the exporters
GPU operators already run (pure, no I/O): NVIDIA's DCGM exporter (names in `wire.dcgm`) and
Prometheus's node-exporter. Samples are `doctor/evidence.py`'s; a page's snapshots come oldest
first, the first taken before the run's first request and the last after its last.

Gauges are read over the snapshots taken while the run ran (all but the first and the last, when
there are three or more): an idle card before and after would pull every mean down. Clocks and
power are read over the snapshots in which the card was busy (utilization at least `BUSY`): a
real card drops its clocks when it idles, which is no throttle.

node-exporter's names (github.com/prometheus/node_exporter, `collector/fixtures/e2e-output.txt`):
`node_cpu_seconds_total{cpu,mode}` (a counter: seconds per CPU and mode), `node_load1`,
`node_memory_MemTotal_bytes`, `node_memory_MemAvailable_bytes`, `node_memory_SwapTotal_bytes`,
`node_memory_SwapFree_bytes` (gauges, bytes) and `node_vmstat_pswpin`/`node_vmstat_pswpout` (pages
swapped in and out since boot; on by default: the vmstat collector's fields match `pswp`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean
from typing import TypeVar
from urllib.parse import urlsplit

from tailguard.doctor.evidence import Samples, delta, gauge
from tailguard.wire import dcgm

BUSY = 0.5  # a snapshot in which the card worked at least half the time
# The saturation signal, best first: how full the SMs are, else how busy the card is (which says
# nothing of how full: a card running any kernel all the time reads 100%).
ACTIVITY = (dcgm.SM_ACTIVE, dcgm.GR_ENGINE_ACTIVE, dcgm.GPU_UTIL)
BUSY_TIME = (dcgm.GR_ENGINE_ACTIVE, dcgm.GPU_UTIL)
T = TypeVar("T")


def during(snaps: Sequence[T]) -> Sequence[T]:
    """The snapshots taken while the run ran: all but the first and last when there are three or more."""
    return snaps[1:-1] if len(snaps) >= 3 else snaps


def page_name(url: str) -> str:
    """A page's host:port, which names a host (node-exporter's page carries no host label)."""
    return urlsplit(url).netloc or url


def is_gpu(s: Samples) -> bool:
    return any(dcgm.is_dcgm(n) for n, _ in s)


def is_host(s: Samples) -> bool:
    return any(n == "node_cpu_seconds_total" for n, _ in s)


def gpus_of(s: Samples, page: str) -> dict[str, dict[str, float]]:
    """Per GPU on a DCGM page ("host gpu N"), its samples' values by name; the `modelName` under
    "modelName" is kept apart by `models_of`."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in s.items():
        if dcgm.is_dcgm(name):
            out.setdefault(gpu_name(dict(labels), page), {})[name] = value
    return out


def gpu_name(labels: dict[str, str], page: str) -> str:
    host = next((labels[k] for k in dcgm.HOST_LABELS if labels.get(k)), page)
    return f"{host} gpu {labels.get('gpu') or labels.get('UUID') or '?'}"


def models_of(s: Samples, page: str) -> dict[str, str]:
    return {gpu_name(d, page): d["modelName"] for (n, labels) in s if dcgm.is_dcgm(n)
            if "modelName" in (d := dict(labels))}


@dataclass(frozen=True)
class GpuEvidence:
    name: str  # "node-1 gpu 0"
    model: str | None
    snapshots: int  # taken while the run ran
    util: float | None  # mean DCGM_FI_DEV_GPU_UTIL, as a share
    activity: float | None  # mean of the best saturation signal there is (`ACTIVITY`), as a share
    activity_of: str | None  # the name it was read from
    fb_used_mib: float | None  # the most memory used
    fb_total_mib: float | None
    power_w: float | None  # the most drawn while busy
    power_limit_w: float | None
    clock_min_mhz: float | None  # the lowest SM clock while busy
    clock_ref_mhz: float | None  # DCGM_FI_DEV_MAX_SM_CLOCK, else the highest it ran at while busy
    clock_ref_of: str
    violations: float | None  # how much the throttle-time counters grew (their unit varies by release)

    @property
    def busy_time_only(self) -> bool:
        """The activity read says how long the card worked, not how full: a weak saturation signal."""
        return self.activity_of in BUSY_TIME

    @property
    def clock_drop(self) -> float | None:
        """How far below its reference the SM clock fell while busy (0.3: to 70% of it)."""
        if self.clock_min_mhz is None or not self.clock_ref_mhz:
            return None
        return max(0.0, 1.0 - self.clock_min_mhz / self.clock_ref_mhz)

    @property
    def power_share(self) -> float | None:
        """The most drawn while busy over the power limit (None without a limit on the page)."""
        return self.power_w / self.power_limit_w if self.power_w is not None and self.power_limit_w else None

    @property
    def fb_share(self) -> float | None:
        return self.fb_used_mib / self.fb_total_mib if self.fb_used_mib is not None and self.fb_total_mib else None


def _busy_share(g: dict[str, float]) -> float | None:
    if dcgm.GPU_UTIL in g:
        return g[dcgm.GPU_UTIL] / 100.0
    return g.get(dcgm.GR_ENGINE_ACTIVE)


def _values(snaps: Sequence[dict[str, float]], name: str) -> list[float]:
    return [g[name] for g in snaps if name in g]


def _activity(snaps: Sequence[dict[str, float]]) -> tuple[float | None, str | None]:
    for name in ACTIVITY:
        vals = _values(snaps, name)
        if vals:
            return mean(vals) / (100.0 if name == dcgm.GPU_UTIL else 1.0), name
    return None, None


def one_gpu(name: str, model: str | None, snaps: Sequence[dict[str, float]]) -> GpuEvidence:
    """A GPU's evidence from its values in each snapshot, oldest first (every snapshot, the
    first and last too: counters are read across them)."""
    inner = during(snaps)
    busy = [g for g in inner if (_busy_share(g) or 0.0) >= BUSY]
    util = _values(inner, dcgm.GPU_UTIL)
    activity, activity_of = _activity(inner)
    used = _values(inner, dcgm.FB_USED)
    totals = [g[dcgm.FB_USED] + g[dcgm.FB_FREE] for g in inner if dcgm.FB_USED in g and dcgm.FB_FREE in g]
    power, limit = _values(busy, dcgm.POWER_USAGE), _values(inner, dcgm.POWER_LIMIT)
    clocks, ceiling = _values(busy, dcgm.SM_CLOCK), _values(inner, dcgm.MAX_SM_CLOCK)
    grew = [snaps[-1].get(n, 0.0) - snaps[0].get(n, 0.0) for n in (dcgm.POWER_VIOLATION, dcgm.THERMAL_VIOLATION)
            if n in snaps[-1]]
    return GpuEvidence(
        name=name, model=model, snapshots=len(inner),
        util=mean(util) / 100.0 if util else None, activity=activity, activity_of=activity_of,
        fb_used_mib=max(used) if used else None, fb_total_mib=max(totals) if totals else None,
        power_w=max(power) if power else None, power_limit_w=min(limit) if limit else None,
        clock_min_mhz=min(clocks) if clocks else None,
        clock_ref_mhz=max(ceiling) if ceiling else (max(clocks) if clocks else None),
        clock_ref_of=dcgm.MAX_SM_CLOCK if ceiling else "the highest it ran at",
        violations=sum(grew) if grew else None,
    )


def gpu_evidence(url: str, snaps: Sequence[Samples]) -> list[GpuEvidence]:
    """Every GPU on one DCGM page, from its snapshots."""
    if not snaps:
        return []
    page = page_name(url)
    per = [gpus_of(s, page) for s in snaps]
    models = models_of(snaps[-1], page)
    names = sorted({n for p in per for n in p})
    return [one_gpu(n, models.get(n), [p.get(n, {}) for p in per]) for n in names]


@dataclass(frozen=True)
class HostEvidence:
    name: str  # the page's host:port
    snapshots: int
    cpus: int
    cpu_busy: float | None  # share of CPU time neither idle nor waiting on I/O, over the run
    load1_max: float | None
    swapped_pages: float | None  # pages swapped in and out during the run
    swap_used_max_bytes: float | None
    mem_available_min: float | None  # the least memory available, as a share of the total

    @property
    def load_per_cpu(self) -> float | None:
        return self.load1_max / self.cpus if self.load1_max is not None and self.cpus else None


def host_evidence(url: str, snaps: Sequence[Samples]) -> HostEvidence | None:
    """One node-exporter page's evidence; None without CPU counters."""
    if not snaps or not is_host(snaps[-1]):
        return None
    inner = during(snaps)
    total = delta(snaps, "node_cpu_seconds_total")
    idle = (delta(snaps, "node_cpu_seconds_total", mode="idle") or 0.0) + \
        (delta(snaps, "node_cpu_seconds_total", mode="iowait") or 0.0)
    cpus = {dict(labels).get("cpu") for (n, labels) in snaps[-1] if n == "node_cpu_seconds_total"}
    swaps = [d for n in ("node_vmstat_pswpin", "node_vmstat_pswpout") if (d := delta(snaps, n)) is not None]
    swap_total, swap_free = gauge(inner, "node_memory_SwapTotal_bytes"), gauge(inner, "node_memory_SwapFree_bytes")
    mem_total, mem_avail = gauge(inner, "node_memory_MemTotal_bytes"), gauge(inner, "node_memory_MemAvailable_bytes")
    load = gauge(inner, "node_load1")
    return HostEvidence(
        name=page_name(url), snapshots=len(inner), cpus=len(cpus),
        cpu_busy=1.0 - idle / total if total and len(snaps) > 1 else None,
        load1_max=max(load) if load else None,
        swapped_pages=sum(swaps) if swaps and len(snaps) > 1 else None,
        swap_used_max_bytes=max(t - f for t, f in zip(swap_total, swap_free)) if swap_total and swap_free else None,
        mem_available_min=min(a / t for a, t in zip(mem_avail, mem_total) if t) if mem_total and mem_avail else None,
    )
