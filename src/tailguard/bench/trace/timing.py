"""Which part of a trace is replayed and how fast: `--window START:DURATION` (trace seconds),
`--limit N` (its first N requests), `--speed X` (X times the trace's rate: the gaps divided by
X); pure. The replay's clock starts at the first request kept, as AIPerf's fixed schedule does
with `--fixed-schedule-auto-offset`, so a window does not open with dead time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tailguard.bench.trace.request import TraceRequest
from tailguard.errors import ConfigError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(text: str, what: str) -> float:
    """`90`, `90s`, `5m`, `1.5h` -> seconds."""
    t = text.strip().lower()
    unit = _UNITS.get(t[-1:], None)
    try:
        value = float(t[:-1] if unit is not None else t) * (unit or 1.0)
    except ValueError:
        raise ConfigError(f"{what} {text!r}: seconds, or a number with s, m or h (90, 5m, 1.5h)") from None
    if value < 0:
        raise ConfigError(f"{what} {text!r} is negative")
    return value


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    duration_s: float

    @classmethod
    def parse(cls, text: str) -> Window:
        """`START:DURATION`, each in seconds or with a unit: `600:300`, `10m:5m`."""
        start, sep, duration = text.partition(":")
        if not sep or not duration.strip():
            raise ConfigError(f"--window {text!r}: START:DURATION in trace seconds, e.g. 600:300 or 10m:5m")
        w = cls(seconds(start or "0", "--window's start"), seconds(duration, "--window's duration"))
        if w.duration_s <= 0:
            raise ConfigError(f"--window {text!r}: the duration must be > 0")
        return w

    def __str__(self) -> str:
        return f"{self.start_s:g}:{self.duration_s:g}"


def select(requests: list[TraceRequest], *, window: Window | None = None, speed: float = 1.0,
           limit: int | None = None) -> list[TraceRequest]:
    """The requests replayed: those due in `window` (all without one), the first `limit` of them,
    counted from the first one kept and `speed` times as fast."""
    if speed <= 0:
        raise ConfigError("--speed must be > 0")
    if limit is not None and limit < 1:
        raise ConfigError("--limit must be at least 1")
    kept = requests
    if window is not None:
        end = window.start_s + window.duration_s
        kept = [r for r in kept if window.start_s <= r.at < end]
    if limit is not None:
        kept = kept[:limit]
    if not kept:
        raise ConfigError(f"no request of the trace is due in --window {window}" if window is not None else
                          "the trace holds no requests")
    t0 = kept[0].at
    return [replace(r, at=(r.at - t0) / speed) for r in kept]
