"""How doctor writes the run's numbers in its findings (pure)."""

from __future__ import annotations


def secs(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v < 0.01:
        return f"{v * 1000:.1f} ms"  # a simulated decode step is a few ms: "0 ms" would say nothing
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def times(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}x"


def pct(v: float) -> str:
    return f"{v * 100:.0f}%"
