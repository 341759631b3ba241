"""Real engine servers as child processes: start, wait until ready, and always stop.

Each engine runs in its own session (process group), so stopping it also ends the workers it forked
(vLLM's EngineCore). Stopping follows what llama-server needs: SIGTERM, about two seconds, SIGTERM
again (a second one forces its exit when a request was running), then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return None


def http_text(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return str(r.read().decode())


@dataclass
class EngineProcess:
    """One engine server; `base_url` has no `/v1`. Use `start()` then `stop()` (idempotent)."""

    name: str
    kind: str  # the gateway's backend kind: "llamacpp" or "vllm"
    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    model: str = "tiny"
    # `max_tokens` of a request that is still running when a test has finished watching it. Tests
    # observe engine states (running, waiting) by polling pages that a busy engine answers slowly
    # (vLLM's API server took 4-10 s per /metrics on a loaded 2-core machine while its engine kept
    # decoding), so such requests end by a test cancelling them, never by running out.
    long_request_tokens: int = 1900
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            if http_status(self.base_url + "/health", timeout_s=1.0) == 200:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {ready_timeout_s:.0f} s:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Abrupt death (SIGKILL to the whole group): what a crashed engine looks like to the gateway."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        p = self.proc
        if p is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
            if p.poll() is not None:
                break
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        # The leader may be gone while forked workers linger in its group: end them too.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.poll() is None:
            p.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
