"""A client connection's one deadline at a time (its request head's, `limits.header_timeout_s`;
on the lean server also keep-alive's): the same timer for both servers (`gateway.http.server`'s
aiohttp handler and `gateway.http.lean`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    """Armed for `after_s` with what to do when it passes (arming again replaces it); disarmed
    once what it waits for comes. It is no longer armed by the time `then` runs."""

    __slots__ = ("_loop", "_handle", "_then")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._then: Callable[[], None] | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, after_s: float, then: Callable[[], None]) -> None:
        self.disarm()
        self._then = then
        self._handle = self._loop.call_later(after_s, self._passed)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _passed(self) -> None:
        self._handle = None
        then = self._then
        assert then is not None
        then()
