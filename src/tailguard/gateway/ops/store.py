"""The gateway's state directory: every config it applied, numbered and hashed, the known-good
baseline, the running gateway's pid, and the reload hand-over between `tailguard config` and it.

    STATE/configs/0003-1f2e3d4c5b6a.yaml   a config as applied (loadable with `load_config`)
    STATE/history.jsonl                    one line per application: {"n", "hash", "at", "how"}
    STATE/good                             the number of the known-good baseline
    STATE/gateway.pid                      the pid of the gateway serving from this directory
    STATE/gateway.lock                     held (flock) by that gateway while it runs
    STATE/reload.request, reload.result    which stored config to apply next, and how that went

Configs are stored by content: applying one equal to a stored config applies that number again
(the history says when), so a rollback does not grow the list. Files are private to the user
(0600 in a 0700 directory): a config holds client and backend keys. A directory of the user's
that others may write to is made 0700 again; one of another user's is refused; no file is
opened through a symbolic link (someone who planted one would have the gateway write keys there).
Keep the directory out of version control (`.tailguard/` in `.gitignore`).

One gateway per directory: a second would take over the pid file, so reloads would go to it
and, once it stopped, find no gateway though the first still ran. `claim()` refuses a second
while the first lives: an exclusive `flock` on `gateway.lock` (the kernel lets it go when the
process ends, however it ends: no stale lock; two gateways started at once cannot both get it),
and a live tailguard pid in `gateway.pid` (a gateway of an older release, which takes no lock).
"""

from __future__ import annotations

import datetime
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import orjson
import yaml

from tailguard.errors import ConfigError
from tailguard.config import GatewayConfig, load_config


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored config: its number, its hash and its file."""

    n: int
    hash: str
    path: Path

    def load(self) -> GatewayConfig:
        return load_config(self.path)


@dataclass(frozen=True, slots=True)
class Applied:
    """One line of the history: config `n` was applied at `at`, at start or by a reload."""

    n: int
    hash: str
    at: str
    how: str


def default_state_dir(config: Path) -> Path:
    """Beside the config file, `.tailguard/<its stem>/`, so each config file has its own history."""
    return config.resolve().parent / ".tailguard" / config.stem


class ConfigStore:
    """Reads and writes one state directory (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._configs = root / "configs"
        self._history = root / "history.jsonl"
        self._good = root / "good"
        self.pid_file = root / "gateway.pid"
        self._lock_file = root / "gateway.lock"
        self._lock: int | None = None  # the lock file's descriptor while this process holds it
        self.request_file = root / "reload.request"
        self.result_file = root / "reload.result"

    # --- configs ------------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """Stored configs, by number."""
        if not self._configs.is_dir():
            return []
        out = []
        for p in self._configs.glob("*.yaml"):
            n, _, h = p.stem.partition("-")
            if n.isdigit() and h:
                out.append(Entry(int(n), h, p))
        return sorted(out, key=lambda e: e.n)

    def get(self, n: int) -> Entry:
        for e in self.entries():
            if e.n == n:
                return e
        known = ", ".join(str(e.n) for e in self.entries()) or "none"
        raise ConfigError(f"no config {n} in {self.root} (stored: {known})")

    def record(self, cfg: GatewayConfig, how: str) -> Entry:
        """Store `cfg` as applied now (`how`: start, reload, rollback): the entry of an equal
        config already stored, or a new number."""
        h = cfg.digest()
        entry = next((e for e in self.entries() if e.hash == h), None)
        if entry is None:
            self._make_dirs()
            n = max((e.n for e in self.entries()), default=0) + 1
            entry = Entry(n, h, self._configs / f"{n:04d}-{h}.yaml")
            # Only what the file set: a dump of every field would mark each as set, and the
            # gateway reads some defaults by whether they were set (the probe's health path).
            data = cfg.model_dump(mode="json", exclude_unset=True)
            _write_private(entry.path, yaml.safe_dump(data, sort_keys=False).encode())
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        line = orjson.dumps({"n": entry.n, "hash": h, "at": now, "how": how}) + b"\n"
        fd = os.open(self._history, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "ab") as f:
            f.write(line)
        return entry

    def history(self) -> list[Applied]:
        if not self._history.exists():
            return []
        out = []
        for line in self._history.read_bytes().splitlines():
            d = orjson.loads(line)
            out.append(Applied(int(d["n"]), str(d["hash"]), str(d["at"]), str(d["how"])))
        return out

    def current(self) -> Entry:
        """The config applied last."""
        hist = self.history()
        if not hist:
            raise ConfigError(f"no config has been applied from {self.root} yet (start `tailguard serve` first)")
        return self.get(hist[-1].n)

    def mark_good(self, n: int) -> Entry:
        entry = self.get(n)
        _write_private(self._good, f"{n}\n".encode())
        return entry

    def good(self) -> Entry | None:
        """The known-good baseline, if one was marked."""
        if not self._good.exists():
            return None
        return self.get(int(self._good.read_text().strip()))

    # --- the running gateway --------------------------------------------------------------------

    def claim(self) -> None:
        """Make this process the directory's one gateway, or raise ConfigError naming the one
        that is and how to choose another directory. Held until `release()` or the process ends."""
        if self._lock is not None:
            return
        self._make_dirs()
        fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._taken(self._gateway_pid()[0])
        pid = self._gateway_pid()[0]
        if pid is not None and pid != os.getpid():
            os.close(fd)
            self._taken(pid)
        self._lock = fd

    def _taken(self, pid: int | None) -> NoReturn:
        who = f"pid {pid}" if pid is not None else "another process"
        raise ConfigError(f"a gateway ({who}) already serves from the state directory {self.root}: stop it first, "
                          "or give this one a state directory of its own with --state-dir DIR")

    def release(self) -> None:
        """Let another gateway have the directory (at exit)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def write_pid(self) -> None:
        self._make_dirs()
        _write_private(self.pid_file, f"{os.getpid()}\n".encode())

    def clear_pid(self) -> None:
        """At exit: only our own pid file (another gateway may have taken the directory since)."""
        try:
            if int(self.pid_file.read_text().strip()) == os.getpid():
                self.pid_file.unlink()
        except (OSError, ValueError):
            pass

    def running_pid(self) -> int:
        """The pid of the gateway serving from this directory; ConfigError when none runs."""
        pid, why = self._gateway_pid()
        if pid is None:
            raise ConfigError(f"no running gateway uses {self.root} ({why})")
        return pid

    def _gateway_pid(self) -> tuple[int | None, str]:
        """The pid file's pid while it names a live gateway, else None and why not. A pid left
        by a gateway that died may name another process by now: where /proc shows command lines,
        one that is not tailguard's is not taken for a gateway (nor signalled)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None, f"no live pid in {self.pid_file.name}"
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and b"tailguard" not in cmdline.read_bytes():
            return None, f"pid {pid} in {self.pid_file.name} is another program now"
        return pid, ""

    def write_json(self, path: Path, data: dict[str, Any]) -> None:
        """Atomically (write, then rename), so a reader never sees half a request or result."""
        self._make_dirs()
        tmp = path.with_suffix(".tmp")
        _write_private(tmp, orjson.dumps(data))
        tmp.replace(path)

    def take_json(self, path: Path) -> dict[str, Any] | None:
        """Read and remove a hand-over file; None when there is none."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = orjson.loads(f.read())
            path.unlink()
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    def _make_dirs(self) -> None:
        for d in (self.root, self._configs):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            _private_dir(d)


def _private_dir(d: Path) -> None:
    """`d` is a real directory only its owner may write to: ours is made 0700 (a 0777 one kept
    its mode before), another user's that others may write to is refused."""
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"state directory {d} is not a directory (a symbolic link?): refusing to keep keys there")
    if st.st_uid == os.getuid():
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(d, 0o700)
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"state directory {d} belongs to another user and others may write to it: "
                          "refusing to keep keys there")


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
