"""How a simulator misbehaves on purpose (`tailguard sim --fault`, `--error-rate`): the hosts a
fleet's health handling must catch, as values; pure, no I/O.

- `hang`: it accepts connections and reads requests, and never answers any of them (a wedged
  process: its health page hangs too);
- `hang-completions`: its health page, `/v1/models` and `/metrics` answer, completions never do
  (an engine whose scheduler is stuck while its HTTP server lives);
- `stall`: its engine stops stepping: streams stay open with no more tokens, new requests get a
  response head and nothing after, while its health page answers (a wedged GPU);
- `error_rate`: that share of completion requests is answered with a 500, spread evenly, so a
  test knows exactly which ones;
- `throttle`: its GPU is held down for the second half of every `THROTTLE_PERIOD_S` (a card at
  its power or thermal limit: a power cap set low with `nvidia-smi -pl`, a failing fan, a hot
  rack): meanwhile its clocks run at that share of their maximum and each step takes 1/share as
  long, so tokens come unevenly whatever the load (`sim.gpu` reports the clocks and power).
Each starts `after_s` simulated seconds after the simulator did (0: from the start), so a host
can go bad mid-run. A host that dies is a process killed (SIGKILL), which needs no option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from tailguard.errors import ConfigError

Fault = Literal["hang", "hang-completions", "stall"]
FAULTS: tuple[str, ...] = ("hang", "hang-completions", "stall")
THROTTLE_PERIOD_S = 4.0  # simulated: two seconds at full clocks, two held down


@dataclass(frozen=True, slots=True)
class Faults:
    """What a simulator does wrong, from `after_s` on; the default is nothing."""

    fault: Fault | None = None
    error_rate: float = 0.0
    after_s: float = 0.0
    throttle: float = 1.0  # the clock share while held down; 1: never throttled

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ConfigError(f"unknown fault {self.fault!r}; known faults: {', '.join(FAULTS)}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"error_rate must be in [0, 1], got {self.error_rate!r}")
        if not self.after_s >= 0.0:
            raise ConfigError(f"the faults' start must be >= 0 s, got {self.after_s!r}")
        if not 0.0 < self.throttle <= 1.0:
            raise ConfigError(f"throttle is the clock share while held down, in (0, 1], got {self.throttle!r}")

    @property
    def misbehaves(self) -> bool:
        """Whether requests themselves are hung or failed (a throttle only slows the engine)."""
        return self.fault is not None or self.error_rate > 0.0

    def hangs(self, completion: bool, now: float) -> bool:
        """Whether a request (a completion, or another route) arriving at simulated instant
        `now` is never answered."""
        if now < self.after_s:
            return False
        return self.fault == "hang" or (self.fault == "hang-completions" and completion)

    def stalls(self, now: float) -> bool:
        """Whether the engine makes no more progress at simulated instant `now`."""
        return self.fault == "stall" and now >= self.after_s

    def clock_share(self, now: float) -> float:
        """The GPU's clock as a share of its maximum for a step starting at simulated instant `now`."""
        if self.throttle == 1.0 or now < self.after_s:
            return 1.0
        held = (now - self.after_s) % THROTTLE_PERIOD_S >= THROTTLE_PERIOD_S / 2
        return self.throttle if held else 1.0


class ErrorSpread:
    """Which completion requests get a 500: the n-th of those counted (from `after_s`) fails
    when it carries the count of failures past a multiple of one, so exactly `rate` of them
    fail, evenly spread (0.5: every second one; 1.0: all), with no randomness to seed."""

    def __init__(self, faults: Faults) -> None:
        self.rate = faults.error_rate
        self.after_s = faults.after_s
        self.counted = 0

    def fails(self, now: float) -> bool:
        """Whether the completion request arriving at simulated instant `now` gets a 500."""
        if self.rate == 0.0 or now < self.after_s:
            return False
        self.counted += 1
        n = self.counted
        return math.floor(n * self.rate + 1e-9) > math.floor((n - 1) * self.rate + 1e-9)
