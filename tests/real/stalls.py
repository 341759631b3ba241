"""What a failure on a starved machine needs said: how late the event loop woke, how much the
machine's tasks waited for a CPU (Linux's pressure stall information), and where the machine's
CPU time went meanwhile, steal (time the hypervisor gave the virtual CPUs to others) included.

On CI, real tests have failed on deadlines (a connect, a health probe) that never fire here. The
loop's worst lateness tells a stalled process apart from a slow engine or a gateway bug, and
steal tells a starved virtual machine apart from a busy one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

TICK_S = 0.05
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class LoopLag:
    """The worst lateness of a `TICK_S` sleep on the running loop, and when it happened."""

    def __init__(self) -> None:
        self.cpu_at_start = cpu_times()
        self.ticks = 0
        self.worst_s = 0.0
        self.worst_at_s = 0.0  # from the start of the watch
        self.over_1s = 0

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK_S)
            late = loop.time() - before - TICK_S
            self.ticks += 1
            self.over_1s += late > 1.0
            if late > self.worst_s:
                self.worst_s, self.worst_at_s = late, before - start

    def describe(self) -> str:
        if not self.ticks:
            return "not watched (the test ran no event loop)"
        return (f"worst wake-up {self.worst_s * 1000:.0f} ms late, {self.worst_at_s:.1f} s into the test; "
                f"{self.over_1s} of {self.ticks} ticks of {TICK_S * 1000:.0f} ms were over 1 s late\n"
                f"the machine's CPU seconds during the test: {cpu_spent(self.cpu_at_start, cpu_times())}")


def cpu_times() -> dict[str, float]:
    """The machine's CPU seconds so far by kind, from /proc/stat (empty where it is not readable)."""
    try:
        values = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    return {name: int(v) / tick for name, v in zip(CPU_FIELDS, values)}


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> str:
    return ", ".join(f"{k} {after[k] - before[k]:.1f}" for k in CPU_FIELDS if k in before and k in after) or "unknown"


def machine_pressure() -> str:
    """Load average and pressure (the share of time some task waited for a CPU, memory or I/O), as
    the kernel tells."""
    lines = []
    for path in ("/proc/loadavg", "/proc/pressure/cpu", "/proc/pressure/memory", "/proc/pressure/io"):
        try:
            lines.append(f"{path}: {Path(path).read_text().strip()}")
        except OSError:
            lines.append(f"{path}: (not readable)")
    return "\n".join(lines)
