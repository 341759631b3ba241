"""A request's line to the front while it is in it: what the gateway's driver holds of it beside
its record (`gateway.request`, facts only). Its exchange talks to the front through it in event
values and decisions, the shape of httpx's auth flow: it tells what happened (`tell`, which
returns the decisions about this request) and awaits what the front decides next (`next`: the
`Start` after a `Wait` or a `Suspend`; `hedge`: the backend of a hedge's second attempt). The
dispatcher carries the front's decisions onto it: a start delivered, a suspension that stops the
attempt in flight, a refusal raised to whoever waits.

    line = dispatcher.line(req)
    start = await dispatcher.admit(line, est_tokens)   # its first Start has come
    decisions = line.tell(Failed(req.id, kind, ...))  # what the front decided of it
    start = await line.next()                          # after a Wait or a Suspend
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from tailguard.errors import APIError
from tailguard.front.events import Decision, Event, Start
from tailguard.gateway.request import Request
from tailguard.gateway.upstream.resume import Transcript
from tailguard.gateway.upstream.watchdog import DeadlineWatch


class TraceHook(Protocol):
    """What a request's trace is told as the front decides of it (`gateway.ops.tracing`
    implements it; a request without a trace has None, and nothing is called)."""

    def started(self, backend: str, resumed: bool, now: float) -> None: ...
    def suspended(self, now: float) -> None: ...
    def failed(self, kind: str, now: float) -> None: ...
    def traceparent(self) -> str | None: ...  # the W3C header for the attempt running now


class Line:
    """One request's line to the front (see the module docstring)."""

    __slots__ = ("request", "transcript", "trace", "watchdog", "hedged", "ended", "told_tokens", "_tell", "_loop",
                 "_next", "_hedge", "_stop")

    def __init__(self, request: Request, tell: Callable[[Event], Sequence[Decision]],
                 loop: asyncio.AbstractEventLoop, transcript: Transcript | None = None,
                 trace: TraceHook | None = None) -> None:
        self.request = request
        self.transcript = transcript  # its text so far: it may be continued (suspended or moved)
        self.trace = trace
        self.watchdog: DeadlineWatch | None = None  # its deadlines, once its exchange runs
        self.hedged: str | None = None  # the backend of its hedge's second attempt, while it races
        self.ended = False  # it left the front (finished, or refused by the front itself)
        self.told_tokens = 0  # what the front was last told it generated (`Generated`)
        self._tell = tell
        self._loop = loop
        self._next: asyncio.Future[Start] = loop.create_future()
        self._hedge: asyncio.Future[str] | None = None
        self._stop: Callable[[], None] | None = None

    # --- its exchange's side --------------------------------------------------------------------

    def tell(self, event: Event) -> list[Decision]:
        """Hand the front `event` (about this request); the decisions about it that came back."""
        rid = self.request.id
        return [d for d in self._tell(event) if getattr(d, "id", None) == rid]

    async def next(self) -> Start:
        """Its next `Start`: the first, or the one after a `Wait` or a `Suspend`. Raises the
        front's refusal (expired in the queue, shut down) as the error its client gets."""
        return await self._next

    def attempting(self, stop: Callable[[], None] | None) -> None:
        """An attempt's upstream is open (`stop` closes it: what a suspension does), or (None)
        closed: a suspension has nothing to stop."""
        self._stop = stop

    def racing(self) -> asyncio.Future[str]:
        """Its exchange races for the first content: the backend of a hedge, once the front
        sends one (`Start` of mode `hedge`)."""
        self._hedge = self._loop.create_future()
        return self._hedge

    def raced(self) -> None:
        self._hedge = None

    # --- the dispatcher's side --------------------------------------------------------------

    def deliver(self, start: Start) -> None:
        """A `Start` of its own attempt: whoever waits for it goes on."""
        if not self._next.done():
            self._next.set_result(start)

    def expect(self) -> None:
        """A `Wait` or a `Suspend`: its next `Start` is still to come."""
        self._next = self._loop.create_future()

    def hedge(self, backend: str) -> None:
        """A `Start` of mode `hedge`: its racing exchange opens the second attempt there."""
        self.hedged = backend
        if self._hedge is not None and not self._hedge.done():
            self._hedge.set_result(backend)

    def stop(self) -> None:
        """A `Suspend`: the attempt in flight stops (its engine frees the slot and the KV)."""
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    def refuse(self, err: APIError) -> None:
        """The front refused or dropped it: whoever waits for its next start gets `err`."""
        if not self._next.done():
            self._next.set_exception(err)

    def leave(self) -> None:
        """It left the front: nothing waits on it any more."""
        self.ended = True
        self._stop = None
        if not self._next.done():
            self._next.cancel()
