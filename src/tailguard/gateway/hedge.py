"""The race of a hedged request: its attempt and, once the front hedges it, a second one on
another backend, each read up to its first content; the first to have content wins, the other is
stopped at once, and the winner's bytes read so far are put back for the relay.

The front decides (`front.hedging`): when a hedge is due (`Start` with mode `hedge`, which the
dispatcher hands to the racing exchange through its `Line`) and which attempt to stop once one has
content (`FirstContent` -> `Drop`); the dispatcher counts what the decisions say. Nothing reaches the consumer before the race ends, so the loser's
bytes never do. An attempt that fails during the race is told to the front (`Failed(backend=)`)
and the other goes on alone; when the last one fails, its error is the request's, as if there had
been no hedge. A deadline (the request's task cancelled) ends both.

    up, backend = await Race(line, backends, opener, limit).run(up, backend)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tailguard.config import BackendConfig
from tailguard.front.events import Failed, FirstContent
from tailguard.gateway.line import Line
from tailguard.gateway.upstream.client import RelayError
from tailguard.gateway.upstream.h1 import H1Response, UpstreamBroke
from tailguard.types import FailureKind
from tailguard.wire.chunks import has_content

Opener = Callable[[BackendConfig], Awaitable[H1Response]]
_OVERLAP = 64  # bytes of the previous read scanned again: a content key split across two reads


async def until_content(up: H1Response, limit: int) -> bytes:
    """Read `up` until its first content-bearing event, its end, or `limit` bytes; what was read.
    Raises `RelayError` when the connection broke first."""
    buf = b""  # a preamble of a chunk or two, usually: joining bytes is the cheapest
    try:
        while True:
            data = await up.readany()
            if not data:
                return buf
            start = max(0, len(buf) - _OVERLAP)
            buf += data
            if has_content(buf, start) or len(buf) >= limit:
                return buf
    except UpstreamBroke as e:
        raise RelayError(FailureKind.DISCONNECT, f"The backend closed the stream before its first token: {e}") from None


class _Attempt:
    """One side of the race: its backend, its upstream once open, its reading."""

    def __init__(self, backend: BackendConfig, up: H1Response | None = None) -> None:
        self.backend = backend
        self.up = up
        self.task: asyncio.Future[bytes] | None = None

    async def read(self, opener: Opener, limit: int) -> bytes:
        if self.up is None:
            self.up = await opener(self.backend)
        return await until_content(self.up, limit)

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.up is not None:
            self.up.close()  # aborts the engine's request (a no-op once released)


class Race:
    """One hedged request's race (see the module docstring)."""

    def __init__(self, line: Line, backends: Mapping[str, BackendConfig], opener: Opener, limit: int) -> None:
        self.line, self.backends = line, backends
        self.opener, self.limit = opener, limit

    async def run(self, up: H1Response, backend: BackendConfig) -> tuple[H1Response, BackendConfig]:
        """The winning attempt's upstream (its bytes so far put back) and backend. Raises the last
        attempt's error when both failed (or the only one did, unhedged)."""
        hedge = self.line.racing()
        attempts = [self._start(_Attempt(backend, up))]
        winner: _Attempt | None = None
        try:
            first = attempts[0].task
            assert first is not None
            waited: list[asyncio.Future[Any]] = [first, hedge]
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            if not first.done():
                attempts.append(self._start(_Attempt(self.backends[hedge.result()])))
            winner = await self._winner(list(attempts))
            return self._won(winner, attempts)
        finally:
            self.line.raced()
            for a in attempts:
                if a is not winner:
                    a.stop()

    def _start(self, a: _Attempt) -> _Attempt:
        a.task = asyncio.ensure_future(a.read(self.opener, self.limit))
        return a

    async def _winner(self, pending: list[_Attempt]) -> _Attempt:
        """The first attempt whose reading ended well; a failed one is told to the front and the
        other waited for."""
        while True:
            done, _ = await asyncio.wait({a.task for a in pending if a.task is not None},
                                         return_when=asyncio.FIRST_COMPLETED)
            for a in [a for a in pending if a.task in done]:
                assert a.task is not None
                err = a.task.exception()
                if err is None:
                    return a
                pending.remove(a)
                if not pending:
                    raise err
                self._lost_to_failure(a, err)

    def _lost_to_failure(self, a: _Attempt, err: BaseException) -> None:
        kind = err.kind if isinstance(err, RelayError) else FailureKind.DISCONNECT
        line = self.line
        if line.hedged is not None and not line.ended:  # the other attempt goes on (a Drop of this one)
            line.tell(Failed(line.request.id, kind, False, a.up is not None, a.backend.name))
        a.stop()

    def _won(self, winner: _Attempt, attempts: list[_Attempt]) -> tuple[H1Response, BackendConfig]:
        """Tell the front which attempt has content; the other stops. The winner's bytes so far go
        back to be relayed."""
        self.line.tell(FirstContent(self.line.request.id, winner.backend.name))
        assert winner.up is not None and winner.task is not None
        winner.up.unread(winner.task.result())
        return winner.up, winner.backend
