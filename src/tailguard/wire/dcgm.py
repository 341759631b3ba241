"""The names and units of NVIDIA's DCGM exporter (`dcgm-exporter`, port 9400), the page GPU
operators scrape for GPU utilization, memory, power and clocks; pure, no I/O. One list for the
three parts that speak it: the simulator exports these names from its model (`sim.gpu`), doctor
reads them (`doctor.hardware`), and the dashboard charts them (`gateway.ops.panels`).

Names, types and units are dcgm-exporter's `etc/default-counters.csv` (github.com/NVIDIA/
dcgm-exporter, main of May 2026): the gauges `DCGM_FI_DEV_GPU_UTIL` (%), `DCGM_FI_DEV_FB_USED` and
`DCGM_FI_DEV_FB_FREE` (MiB), `DCGM_FI_DEV_POWER_USAGE` (W), `DCGM_FI_DEV_SM_CLOCK` (MHz) and
`DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio, 0-1) are on by default. `DCGM_FI_PROF_SM_ACTIVE` (a
ratio) is listed there commented out; `DCGM_FI_DEV_POWER_MGMT_LIMIT` (W) and
`DCGM_FI_DEV_MAX_SM_CLOCK` (MHz) are DCGM fields (`dcgm_fields.h`) a counters CSV may add
(`dcgm-exporter -f my-counters.csv`). Each sample is labelled by GPU: `gpu` (its index), `UUID`,
`pci_bus_id`, `device`, `modelName`, and the node's `Hostname` (`hostname` in newer releases), as
its `internal/pkg/rendermetrics/render_metrics.go` writes them.

`GPU_UTIL` is NVML's "percent of time over the past sample period during which one or more kernels
was executing" (`nvmlUtilization_t`; the period is 1/6 s to 1 s by product): a GPU running any
kernel all the time reads 100% however little of it the kernels fill. `SM_ACTIVE` is the share of
cycles an SM has a warp assigned, averaged over the SMs: how much of the GPU the work fills.
"""

from __future__ import annotations

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # % of the sample period with a kernel running
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio of time the graphics engine is active
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"  # ratio of cycles an SM has at least one warp assigned
FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"  # W
POWER_LIMIT = "DCGM_FI_DEV_POWER_MGMT_LIMIT"  # W; not in the default counters
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz
MAX_SM_CLOCK = "DCGM_FI_DEV_MAX_SM_CLOCK"  # MHz; not in the default counters
# Counters of time spent held down (ns in current releases, us in older ones): commented out in
# the default counters; doctor reads only whether they grew.
POWER_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION"
THERMAL_VIOLATION = "DCGM_FI_DEV_THERMAL_VIOLATION"

# Gauges and their help lines, as dcgm-exporter prints them (the simulator's page uses these).
HELP: dict[str, str] = {
    GPU_UTIL: "GPU utilization (in %).",
    GR_ENGINE_ACTIVE: "Ratio of time the graphics engine is active.",
    SM_ACTIVE: "The ratio of cycles an SM has at least 1 warp assigned.",
    FB_USED: "Framebuffer memory used (in MiB).",
    FB_FREE: "Framebuffer memory free (in MiB).",
    POWER_USAGE: "Power draw (in W).",
    POWER_LIMIT: "Power management limit (in W).",
    SM_CLOCK: "SM clock frequency (in MHz).",
    MAX_SM_CLOCK: "Maximum SM clock frequency (in MHz).",
}
# The labels that name one GPU, in dcgm-exporter's order.
LABELS: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
HOST_LABELS: tuple[str, ...] = ("Hostname", "hostname")


def is_dcgm(name: str) -> bool:
    """A sample name from a DCGM exporter."""
    return name.startswith("DCGM_FI_")
