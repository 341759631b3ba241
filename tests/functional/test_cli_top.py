"""`tailguard top` as a user runs it: in a pseudo-terminal 80 columns wide, against a real gateway
under load; it shows every field, says when the gateway is unreachable, and leaves on Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import signal
import time
from typing import Any

from openai import AsyncOpenAI

from tests.cli import TAILGUARD
from tests.functional.gateways import dead_url, gateway

CHAT = [{"role": "user", "content": "hi"}]
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """`tailguard top URL ARGS` on a pty of its own (its controlling terminal, so Ctrl-C is a keypress)."""

    def __init__(self, url: str, *args: str, **env_vars: str) -> None:
        env = {**{k: v for k, v in os.environ.items() if k != "TAILGUARD_API_KEY"},
               "COLUMNS": "80", "LINES": "40", "TERM": "xterm-256color", **env_vars}
        pid, fd = pty.fork()
        if pid == 0:  # the child: Ctrl-C's default back (a suite started with `&` ignores SIGINT), then exec
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(TAILGUARD, [TAILGUARD, "top", url, *args], env)
        self.pid, self.fd = pid, fd
        self.out = b""

    def read_for(self, seconds: float, until: tuple[str, ...] = ()) -> str:
        """Everything shown so far, escape codes removed, after reading for `seconds`, or less:
        until every one of `until` (if given) has been shown."""
        end = time.monotonic() + seconds
        os.set_blocking(self.fd, False)
        while time.monotonic() < end:
            try:
                self.out += os.read(self.fd, 65536)
            except BlockingIOError:
                if until and all(text in self.screen() for text in until):
                    break
                time.sleep(0.05)
            except OSError:  # the child has gone: its end of the pty closed
                break
        return self.screen()

    def screen(self) -> str:
        return _ANSI.sub(b"", self.out).decode("utf-8", "replace")

    def exit_code(self, limit_s: float = 10.0) -> int:
        """Wait for it to leave on its own."""
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            self.read_for(0.1)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        self.kill()
        raise AssertionError("tailguard top did not leave (on its own, or on Ctrl-C)")

    def ctrl_c(self, limit_s: float = 10.0) -> int:
        os.write(self.fd, b"\x03")
        return self.exit_code(limit_s)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


async def _load(url: str, stop: asyncio.Event) -> None:
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-app", max_retries=0) as c:
        while not stop.is_set():
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
            await asyncio.sleep(0.05)


FIELDS = ("classes", "interactive", "admitted/s", "rejected/s", "TTFT P99", "backends", "sim0", "healthy", "/8",
          "engine run/wait", "top callers", "app", "GPU tailguard-sim gpu 0", "util", "/700 W", "/1980 MHz",
          "unreachable", "Ctrl-C to quit")


async def test_top_shows_classes_backends_and_callers_and_leaves_on_ctrl_c() -> None:
    cfg: dict[str, Any] = {"auth": {"api_keys": {"sk-app": {"name": "app"}}}}
    async with asyncio.timeout(40), gateway(**cfg) as gw:
        stop = asyncio.Event()
        load = asyncio.create_task(_load(gw.url, stop))
        # the simulator's page carries its modelled GPU's DCGM gauges: a line for it
        term = Terminal(gw.url, "--gpu-metrics", gw.sims[0].url, "--gpu-metrics", dead_url())
        try:
            screen = await asyncio.to_thread(term.read_for, 20.0, FIELDS)
            code = await asyncio.to_thread(term.ctrl_c)
        finally:
            term.kill()
            stop.set()
            await load
    for field in FIELDS:
        assert field in screen, f"{field!r} not shown:\n{screen[-3000:]}"
    assert code == 0 and "Traceback" not in screen
    assert max(len(line) for line in screen.splitlines()) <= 80


def test_top_says_when_the_gateway_is_unreachable() -> None:
    term = Terminal(dead_url())
    try:
        screen = term.read_for(20.0, ("gateway unreachable", "trying again"))
        code = term.ctrl_c()
    finally:
        term.kill()
    assert "gateway unreachable" in screen and "trying again" in screen
    assert code == 0 and "Traceback" not in screen


ADMIN = "admin-key-0123456789"
KEYED: dict[str, Any] = {"auth": {"api_keys": {"sk-app": {"name": "app"}}, "admin_keys": [ADMIN], "open_metrics": "keys"}}


async def test_top_sends_an_admin_key_and_says_a_401_as_a_401() -> None:
    """Against a gateway whose /metrics needs an admin key: without one, a 401 said as such, with
    the flag to use, and exit 1 (not "unreachable", not a retry forever); a client key is a 403;
    with --api-key or TAILGUARD_API_KEY, the live view."""
    async with asyncio.timeout(60), gateway(**KEYED) as gw:
        def screen_of(*args: str, **env: str) -> tuple[str, int]:
            term = Terminal(gw.url, *args, **env)
            try:
                code = term.exit_code(limit_s=30)  # its first frame, then it leaves: however slow the machine
                return _ANSI.sub(b"", term.out).decode("utf-8", "replace"), code
            finally:
                term.kill()

        screen, code = await asyncio.to_thread(screen_of)
        assert code == 1 and "answered 401" in screen and "--api-key" in screen and "TAILGUARD_API_KEY" in screen
        assert "unreachable" not in screen and "Traceback" not in screen
        screen, code = await asyncio.to_thread(screen_of, "--api-key", "sk-app")
        assert code == 1 and "answered 403" in screen and "admin key" in screen
        screen, code = await asyncio.to_thread(screen_of, "--api-key", "wrong-key")
        assert code == 1 and "does not accept the key" in screen and "wrong-key" not in screen

        for args, env in ((("--api-key", ADMIN), {}), ((), {"TAILGUARD_API_KEY": ADMIN})):
            term = Terminal(gw.url, *args, **env)
            try:
                screen = await asyncio.to_thread(term.read_for, 20.0, ("classes", "sim0"))
                code = await asyncio.to_thread(term.ctrl_c)
            finally:
                term.kill()
            assert "classes" in screen and "sim0" in screen and "401" not in screen, screen[-2000:]
            assert code == 0
