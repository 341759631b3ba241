"""What a failure on a starved machine needs said: how late the event loop woke, and how much
the machine's tasks waited for a CPU (Linux's pressure stall information).

On CI, real tests have failed on deadlines (a connect, a health probe) that never fire here. The
loop's worst lateness tells a stalled process apart from a slow engine or a gateway bug."""

from __future__ import annotations

import asyncio
from pathlib import Path

TICK_S = 0.05


class LoopLag:
    """The worst lateness of a `TICK_S` sleep on the running loop, and when it happened."""

    def __init__(self) -> None:
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
                f"{self.over_1s} of {self.ticks} ticks of {TICK_S * 1000:.0f} ms were over 1 s late")


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
