"""Deadlines for sync reads: one thread per client shuts a stalled stream's socket when its
deadline passes, which wakes the read that is blocked on it.

A blocking `recv` cannot be cancelled, and httpx's read timeout is fixed for the whole body and
restarts with every byte, so keep-alives would hold it open forever. Shutting the socket down
(`SHUT_RDWR`) from another thread makes the blocked read return at once; the stream then sees
that its watchdog fired and raises the deadline's own exception.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time


class Watchdog:
    """Shuts armed sockets at their deadlines (instants on `time.monotonic`).

        key = dog.arm(None, at, sock)    # a new key; arm(key, later, sock) moves it
        dog.fired(key)                   # did it shut this socket?
        dog.disarm(key)
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, socket.socket]] = {}
        self._fired: set[int] = set()
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, key: int | None, at: float | None, sock: socket.socket | None) -> int:
        with self._cond:
            key = next(self._keys) if key is None else key
            if at is None or sock is None:
                self._due.pop(key, None)
            else:
                self._due[key] = (at, sock)
                self._start()
                self._cond.notify()
            return key

    def disarm(self, key: int) -> None:
        with self._cond:
            self._due.pop(key, None)
            self._fired.discard(key)

    def fired(self, key: int) -> bool:
        with self._cond:
            return key in self._fired

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="tailguard-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                for key, (at, sock) in list(self._due.items()):
                    if at <= now:
                        del self._due[key]
                        self._fired.add(key)
                        _shut(sock)
                wait = min((at for at, _ in self._due.values()), default=now + 60.0) - now
                self._cond.wait(timeout=max(wait, 0.0))


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed by its owner: nothing left to wake
        pass
