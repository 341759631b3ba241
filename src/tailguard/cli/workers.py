"""`tailguard serve --workers N`: N gateway processes on one port, each listening with
SO_REUSEPORT so the kernel spreads connections over them (nginx's `reuseport`, gunicorn's
`--reuse-port`), and a parent that starts them, forwards its signals (SIGHUP reloads every worker,
SIGINT/SIGTERM stop them, forwarded as SIGTERM) and stops the rest once one has ended.

The workers are forked before any event loop exists, from the config the parent has already
checked, so a bad config fails once, in the parent. Port 0 is resolved by the parent: it binds
one SO_REUSEPORT socket to learn a free port and holds it (bound, never listening, so the kernel
sends it no connection) while the workers bind the same port.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def hold_port(host: str, port: int) -> tuple[int, socket.socket | None]:
    """The port the workers share: `port`, or for 0 a free one held by the returned socket."""
    if port != 0:
        return port, None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((host, 0))
    return int(holder.getsockname()[1]), holder


def run_workers(n: int, worker: Callable[[int], None]) -> int:
    """Fork `n` processes running `worker(index)`; return the first non-zero exit status among
    them (0 when all ended cleanly)."""
    pids: list[int] = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the parent's code
            code = 0
            try:
                worker(i)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    return _supervise(pids)


def _supervise(pids: list[int]) -> int:
    alive = set(pids)
    stopping = False  # every worker was told to stop: a second SIGTERM would find its handler gone

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        if signum != signal.SIGHUP:
            if stopping:
                return
            stopping = True
            # A terminal's Ctrl-C reached the workers too: a second SIGINT would end their drain
            # (it is how a user forces a stop), a SIGTERM is a no-op to a worker already stopping.
            signum = signal.SIGTERM
        for pid in alive:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    status = 0
    while alive:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        if pid not in alive:
            continue
        alive.discard(pid)
        code = os.waitstatus_to_exitcode(raw)
        if code != 0 and status == 0:
            status = code if code > 0 else 128 - code  # killed by a signal: the shell's convention
        if alive:  # one worker ended: the port is short of it, so the others stop too
            forward(signal.SIGTERM, None)
    return status
