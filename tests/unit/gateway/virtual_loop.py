"""An asyncio loop on virtual time, for the gateway's timer-driven parts (the watchdog, the
dispatcher's queue deadlines): the loop never sleeps, it jumps to its next timer, and the part
under test reads the same clock (it is given it). So a deadline fires at exactly
its instant, and a test that waits for more than its own timers fails at once instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualClock:
    """The test's time, in seconds: the loop's `time()` and the clock the part under test is given."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class _JumpingSelector:
    """A real selector (sockets, the loop's self-pipe) that, where the loop would block until its
    next timer, moves the clock there instead."""

    def __init__(self, clock: VirtualClock) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: the awaited thing can never happen
            raise RuntimeError("the test awaits something no timer or socket will ever bring")
        self._clock.now += timeout
        return []

    def __getattr__(self, name: str) -> Any:  # register, unregister, modify, get_map, close ...
        return getattr(self._inner, name)


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_JumpingSelector(clock))  # type: ignore[arg-type]
        self._clock = clock

    def time(self) -> float:
        return self._clock.now


def run(clock: VirtualClock, main: Callable[[asyncio.AbstractEventLoop], Coroutine[Any, Any, T]]) -> T:
    """Run `main(loop)` as a task on a fresh virtual-time loop, bounded by 10,000 virtual seconds."""
    loop = _VirtualLoop(clock)

    async def bounded() -> T:
        async with asyncio.timeout(10_000):
            return await main(loop)

    try:
        return loop.run_until_complete(bounded())
    finally:
        loop.close()
