"""How a simulator misbehaves on purpose (`tailguard sim --fault`, `--error-rate`): the hosts a
fleet's health handling must catch, as values; pure, no I/O.

- `hang`: it accepts connections and reads requests, and never answers any of them (a wedged
  process: its health page hangs too);
- `hang-completions`: its health page, `/v1/models` and `/metrics` answer, completions never do
  (an engine whose scheduler is stuck while its HTTP server lives);
- `error_rate`: that share of completion requests is answered with a 500, from `errors_after_s`
  simulated seconds after it started; spread evenly, so a test knows exactly which ones.
A host that dies is a process killed (SIGKILL), which needs no option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from tailguard.errors import ConfigError

Hang = Literal["hang", "hang-completions"]
HANGS: tuple[str, ...] = ("hang", "hang-completions")


@dataclass(frozen=True, slots=True)
class Faults:
    """What a simulator does wrong; the default is nothing."""

    hang: Hang | None = None
    error_rate: float = 0.0
    errors_after_s: float = 0.0

    def __post_init__(self) -> None:
        if self.hang is not None and self.hang not in HANGS:
            raise ConfigError(f"unknown fault {self.hang!r}; known faults: {', '.join(HANGS)}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"error_rate must be in [0, 1], got {self.error_rate!r}")
        if not self.errors_after_s >= 0.0:
            raise ConfigError(f"errors_after_s must be >= 0, got {self.errors_after_s!r}")

    def hangs(self, completion: bool) -> bool:
        """Whether a request (a completion, or another route) is never answered."""
        return self.hang == "hang" or (self.hang == "hang-completions" and completion)


class ErrorSpread:
    """Which completion requests get a 500: the n-th of those counted (from `errors_after_s`)
    fails when it carries the count of failures past a multiple of one, so exactly `rate` of
    them fail, evenly spread (0.5: every second one; 1.0: all), with no randomness to seed."""

    def __init__(self, faults: Faults) -> None:
        self.rate = faults.error_rate
        self.after_s = faults.errors_after_s
        self.counted = 0

    def fails(self, now: float) -> bool:
        """Whether the completion request arriving at simulated instant `now` gets a 500."""
        if self.rate == 0.0 or now < self.after_s:
            return False
        self.counted += 1
        n = self.counted
        return math.floor(n * self.rate + 1e-9) > math.floor((n - 1) * self.rate + 1e-9)
