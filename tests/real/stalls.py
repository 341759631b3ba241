"""What a failure on a starved machine needs said: how late the event loop woke, how much the
machine's tasks waited for a CPU (Linux's pressure stall information), and where the machine's
CPU time went meanwhile, steal (time the hypervisor gave the virtual CPUs to others) included.

On CI, real tests have failed on deadlines (a connect, a health probe) that never fire here. The
loop's worst lateness tells a stalled process apart from a slow engine or a gateway bug, and
steal tells a starved virtual machine apart from a busy one."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import traceback
from pathlib import Path

TICK_S = 0.05
STALL_S = 5.0  # a loop this late gets its stack taken: what it was doing, not only that it was late
STACKS_KEPT = 3
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class LoopLag:
    """The worst lateness of a `TICK_S` sleep on the running loop, and when it happened."""

    def __init__(self) -> None:
        self.cpu_at_start = cpu_times()
        self.ticks = 0
        self.worst_s = 0.0
        self.worst_at_s = 0.0  # from the start of the watch
        self.over_1s = 0
        self.stalled_stacks: list[str] = []
        self._beat = time.monotonic()
        self._loop_thread = threading.get_ident()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._left = False  # the loop stopped running since the last tick (a synchronous fixture ran)
        self._stop = threading.Event()

    async def watch(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        start = loop.time()
        self._loop_thread = threading.get_ident()
        watchdog = threading.Thread(target=self._watchdog, name="loop-lag-watchdog", daemon=True)
        watchdog.start()
        try:
            while True:
                before = loop.time()
                self._beat = time.monotonic()
                await asyncio.sleep(TICK_S)
                late = loop.time() - before - TICK_S
                if self._left:  # the loop was not running (pytest set up a synchronous fixture): no stall
                    self._left = False
                    continue
                self.ticks += 1
                self.over_1s += late > 1.0
                if late > self.worst_s:
                    self.worst_s, self.worst_at_s = late, before - start
        finally:
            self._stop.set()

    def _watchdog(self) -> None:
        """Take the loop thread's stack once per stall longer than `STALL_S`: a stalled loop cannot
        report on itself, and a lateness alone does not say whether the machine or our code held it."""
        taken_for = None
        while not self._stop.wait(1.0):
            if self._loop is not None and not self._loop.is_running():
                self._left = True
                continue
            beat = self._beat
            if time.monotonic() - beat < STALL_S or taken_for == beat or len(self.stalled_stacks) >= STACKS_KEPT:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is not None:
                stack = "".join(traceback.format_stack(frame)[-15:])
                self.stalled_stacks.append(f"stalled over {STALL_S:g} s in:\n{stack}")
            taken_for = beat

    @property
    def stalled(self) -> bool:
        """The loop stood still for over `STALL_S` (its stack was taken, or a wake-up came that late)."""
        return self.worst_s > STALL_S or bool(self.stalled_stacks)

    def describe(self) -> str:
        if not self.ticks:
            return "not watched (the test ran no event loop)"
        return (f"worst wake-up {self.worst_s * 1000:.0f} ms late, {self.worst_at_s:.1f} s into the test; "
                f"{self.over_1s} of {self.ticks} ticks of {TICK_S * 1000:.0f} ms were over 1 s late\n"
                f"the machine's CPU seconds during the test: {cpu_spent(self.cpu_at_start, cpu_times())}"
                + "".join(f"\n{stack}" for stack in self.stalled_stacks))


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
