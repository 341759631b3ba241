"""The simulated engine's GPU, as a DCGM exporter would report it: a model, not a measurement;
pure, no I/O, told the time.

The simulator knows what its engine did in each step (when it began, how long it took, how full
its batch was), so it can say what a GPU doing that work would show:

- utilization (`DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_PROF_GR_ENGINE_ACTIVE`): the share of the last
  `WINDOW_S` simulated seconds spent in steps, which is what NVML means by it (time with a kernel
  running, whatever the kernel fills);
- SM activity (`DCGM_FI_PROF_SM_ACTIVE`): busy time weighted by each step's fill, the larger of
  its decoding sequences over `max_num_seqs` and its tokens over `max_num_batched_tokens`: how much
  of the engine's capacity the steps use (a real SM_ACTIVE counts warps, not sequences);
- memory (`DCGM_FI_DEV_FB_USED`/`_FREE`): the weights, a fixed runtime overhead and the KV blocks
  in use (a real vLLM reserves its whole KV pool at start, so its FB_USED stays flat near
  `gpu_memory_utilization`; read `vllm:kv_cache_usage_perc` for its KV use);
- power (`DCGM_FI_DEV_POWER_USAGE`): idle power plus a share of the span to the card's limit that
  grows with busy time and fill, reaching 90% of it at a full batch that never pauses;
- SM clock (`DCGM_FI_DEV_SM_CLOCK`): the card's maximum while it works, its idle clock when the
  window held no step.

Clock and power are averaged over the window (a real exporter reports an instant's value; an
average means a scrape at any moment sees a card held down part of the time).

A throttled card (`tailguard sim --throttle SHARE`, `sim.fault`) runs at SHARE of its maximum
clock while held down, draws its power limit meanwhile (the cap is why it slows), and its steps
take 1/SHARE as long.

Card figures are the vendors' published ones (H100 SXM5 80GB: 700 W, 1,980 MHz boost; A100 SXM4
80GB: 400 W, 1,410 MHz); idle power and clocks are typical nvidia-smi readings of an idle card;
memory is what nvidia-smi reports as the total (81,559 MiB on an H100 80GB HBM3).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW_S = 1.0  # NVML's utilization sample period is 1/6 s to 1 s by product; the simulator uses 1 s
# Power between idle and the limit: this much per unit of busy time, and this much more per unit of
# SM activity; a full batch that never pauses draws idle + 90% of the span.
POWER_BUSY = 0.3
POWER_FILL = 0.6


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One card with one model's weights on it."""

    model_name: str  # as nvidia-smi names the card (dcgm-exporter's `modelName`)
    memory_mib: float
    weights_mib: float
    overhead_mib: float  # CUDA context, activations, the sampler: what is neither weights nor KV
    kv_bytes_per_token: int
    idle_w: float
    limit_w: float
    idle_sm_clock_mhz: float
    max_sm_clock_mhz: float


# Llama-3-8B in bf16: 8.03e9 parameters x 2 bytes; KV: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes.
LLAMA8B_WEIGHTS_MIB = 15_316.0
LLAMA8B_KV_BYTES = 131_072
H100_80GB = GpuSpec("NVIDIA H100 80GB HBM3", 81_559.0, LLAMA8B_WEIGHTS_MIB, 3_072.0, LLAMA8B_KV_BYTES,
                    idle_w=70.0, limit_w=700.0, idle_sm_clock_mhz=345.0, max_sm_clock_mhz=1_980.0)
A100_80GB = GpuSpec("NVIDIA A100-SXM4-80GB", 81_920.0, LLAMA8B_WEIGHTS_MIB, 3_072.0, LLAMA8B_KV_BYTES,
                    idle_w=60.0, limit_w=400.0, idle_sm_clock_mhz=210.0, max_sm_clock_mhz=1_410.0)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What the card shows at one instant, in DCGM's units."""

    util_pct: float
    gr_engine_active: float
    sm_active: float
    fb_used_mib: float
    fb_free_mib: float
    power_w: float
    power_limit_w: float
    sm_clock_mhz: float
    max_sm_clock_mhz: float


class GpuMeter:
    """The steps of the last `WINDOW_S` seconds, and what a card doing them shows.

        meter = GpuMeter(H100_80GB)
        meter.step(start=t, duration_s=0.012, fill=0.5, clock_share=1.0)   # once per engine step
        meter.read(now, kv_tokens=20_000, working=True)                  # at scrape time
    """

    def __init__(self, spec: GpuSpec, window_s: float = WINDOW_S) -> None:
        self.spec = spec
        self.window_s = window_s
        self._steps: deque[tuple[float, float, float, float]] = deque()  # (start, end, fill, clock share)

    def step(self, start: float, duration_s: float, fill: float, clock_share: float) -> None:
        self._steps.append((start, start + duration_s, min(max(fill, 0.0), 1.0), clock_share))
        horizon = start - self.window_s
        while self._steps and self._steps[0][1] < horizon:
            self._steps.popleft()

    def extend(self, end: float) -> None:
        """The last step lasted until `end`: a simulator that fell behind its clock carries on from
        now, and the time it lost is its own slowness, not the modelled card's idleness."""
        if self._steps and self._steps[-1][1] < end:
            start, _, fill, share = self._steps[-1]
            self._steps[-1] = (start, end, fill, share)

    def read(self, now: float, kv_tokens: int, working: bool) -> GpuReading:
        """The card over the window ending at `now`, with `kv_tokens` of KV in memory; `working`:
        the engine has requests (between two steps the card is still busy: the next one is on its
        way). Clock and power are averages over the window, so a scrape sees a card held down
        part of the time whenever it scrapes."""
        s = self.spec
        since = now - self.window_s
        busy = active = clocked = held = 0.0
        n = len(self._steps)
        for i, (start, end, fill, share) in enumerate(self._steps):
            if working and i == n - 1:
                end = max(end, now)
            overlap = min(end, now) - max(start, since)
            if overlap > 0:
                busy += overlap
                active += overlap * fill
                clocked += overlap * share
                held += overlap if share < 1.0 else 0.0
        clock = s.max_sm_clock_mhz * clocked / busy if busy > 0 else s.idle_sm_clock_mhz
        busy, active, held = (min(x / self.window_s, 1.0) for x in (busy, active, held))
        drawn = s.idle_w + (s.limit_w - s.idle_w) * (POWER_BUSY * busy + POWER_FILL * active)
        power = drawn * (1.0 - held) + s.limit_w * held  # held down, it draws its limit
        used = min(s.weights_mib + s.overhead_mib + kv_tokens * s.kv_bytes_per_token / 2**20, s.memory_mib)
        return GpuReading(util_pct=round(busy * 100.0), gr_engine_active=busy, sm_active=active, fb_used_mib=round(used),
                          fb_free_mib=round(s.memory_mib - used), power_w=power, power_limit_w=s.limit_w,
                          sm_clock_mhz=round(clock), max_sm_clock_mhz=s.max_sm_clock_mhz)
