"""How long a request would wait, and whether to admit it: the shedding estimate; pure, no I/O.

The expected wait is the work ahead over the measured drain rate, scaled by how far real waits
have run over such predictions lately (a feedback in the spirit of CoDel: under sustained
overload the admitted queue stays short enough that what is admitted is served within its
bound, and the excess is refused at once). The scheduler owns one and tells it what happened,
with `now`; it knows nothing of queues or classes, only counts and seconds.
"""

from __future__ import annotations

import math
from collections import deque

from tailguard.front.params import QueueParams

# A request is admitted while its expected wait is within this share of its bound: the estimate
# is a mean, and without a margin about half of those admitted near the bound would pass it.
_ADMIT_SHARE = 0.8

# Wait feedback: each dispatched (or expired) request compares its real wait with the raw wait
# predicted when it was admitted (backlog / drain rate); the EWMA of (real + slack) /
# (predicted + slack) scales later predictions, within these bounds. The slack keeps near-zero
# waits from giving wild ratios.
_WAIT_SLACK_S = 0.1
_WAIT_FACTOR_BOUNDS = (0.5, 8.0)


class Admission:
    """The drain rate, the wait feedback and the Retry-After they give, on plain numbers.

        a = Admission(QueueParams())
        a.completed(now=0.0, queued=3); a.completed(now=0.5, queued=2)   # 2 per s while backlogged
        predicted_s = a.predict_s(ahead=4)                               # 2.0 s
        a.refusal_s(predicted_s, budget_s=1.0)                           # 1.0: retry in a second
        a.learn(predicted_s, waited_s=3.0)                               # it waited longer: scale up
    """

    def __init__(self, cfg: QueueParams) -> None:
        self._cfg = cfg
        # Drain rate: completions over the time they took, counted over the latest ones that
        # came while requests were queued the whole time (otherwise the gaps measure demand, not
        # capacity). A window, not an EWMA of gaps: a batching engine ends requests in bursts,
        # and a mean of gaps swings with the phase of the burst it was last fed.
        self._finishes: deque[float] = deque(maxlen=max(8, round(4 / cfg.drain_ewma_weight)))
        self._backlogged = False
        self._wait_factor = 1.0  # real waits over predicted ones, lately (see _WAIT_SLACK_S)
        # The rate the last backlog drained at: what a TTFT target is admitted by at the start of the
        # next one, before its own two completions (`recent_predict_s`).
        self._last_rate: float | None = None

    def carry_over(self, cfg: QueueParams) -> Admission:
        """The same measurements under new parameters (a live reconfiguration): the window of
        completions (its newest ones, if the new window is shorter) and the wait feedback."""
        new = Admission(cfg)
        new._finishes.extend(self._finishes)
        new._backlogged = self._backlogged
        new._wait_factor = self._wait_factor
        new._last_rate = self._last_rate
        return new

    # --- what the scheduler tells it ----------------------------------------------------------

    def completed(self, now: float, queued: int) -> None:
        """A running request finished at `now`, leaving `queued` requests waiting."""
        if not self._backlogged:
            self._finishes.clear()  # idle since the last one: that gap says nothing of capacity
        self._finishes.append(now)
        self._backlogged = queued > 0
        rate = self.drain_rate()
        if rate is not None and rate != math.inf:
            self._last_rate = rate

    def emptied(self) -> None:
        """The queue ran empty: the gap until the next completion may be idle time."""
        self._backlogged = False

    def learn(self, predicted_s: float | None, waited_s: float) -> None:
        """A request left the queue after `waited_s`; `predicted_s` is the raw wait predicted when
        it was admitted (None: it was not predicted, e.g. requeued after a suspension)."""
        if predicted_s is None:
            return
        sample = (waited_s + _WAIT_SLACK_S) / (predicted_s + _WAIT_SLACK_S)
        f = self._wait_factor + self._cfg.drain_ewma_weight * (sample - self._wait_factor)
        lo, hi = _WAIT_FACTOR_BOUNDS
        self._wait_factor = min(hi, max(lo, f))

    # --- what it answers ----------------------------------------------------------------------

    def drain_rate(self) -> float | None:
        """Measured completions per second while backlogged; None until measured."""
        f = self._finishes
        if len(f) < 2:
            return None
        span = f[-1] - f[0]
        return math.inf if span <= 0 else (len(f) - 1) / span

    def predict_s(self, ahead: int) -> float | None:
        """The raw wait (before the feedback) behind `ahead` requests expected to leave first.
        None before a rate is known."""
        rate = self.drain_rate()
        if rate is None:
            return None
        return ahead / rate if ahead else 0.0

    def recent_predict_s(self, ahead: int) -> float | None:
        """`predict_s`, or before this backlog's rate is measured, the wait at the rate the last
        backlog drained at: a burst after an idle spell is admitted by its TTFT target from its
        first request, not only once two of it have completed. None before any rate was measured."""
        predicted = self.predict_s(ahead)
        if predicted is not None or self._last_rate is None:
            return predicted
        return ahead / self._last_rate

    def refusal_s(self, predicted_s: float | None, budget_s: float) -> float | None:
        """The Retry-After for a request whose raw predicted wait is `predicted_s` and which may
        wait `budget_s` more, or None to admit it (always, while nothing is predicted)."""
        if predicted_s is None:
            return None
        expected_s = predicted_s * self._wait_factor
        if expected_s > budget_s * _ADMIT_SHARE:
            # Retry once enough of the backlog has drained for the bound to be met.
            return self.clamp(expected_s - max(budget_s, 0.0))
        return None

    def late_s(self, predicted_s: float | None, service_s: float | None, budget_s: float,
               margin: float) -> float | None:
        """By how much a request with a TTFT target is predicted to miss it: its expected wait
        (`predicted_s`, raw, scaled by the feedback) plus its predicted TTFT once started
        (`service_s`, `front.latency`), against `margin` x the `budget_s` left until its deadline.
        None when it makes it, when nothing is predicted yet, or when it would miss even with
        nothing ahead of it (then no wait is to blame: it is served, late, as it would be alone)."""
        if predicted_s is None or service_s is None or misses_alone(service_s, budget_s, margin):
            return None
        allowed_s = budget_s * margin
        expected_s = predicted_s * self._wait_factor + service_s
        return expected_s - allowed_s if expected_s > allowed_s else None

    def requests_in(self, seconds: float) -> int | None:
        """How many requests fewer ahead would shorten an expected wait by `seconds` (None before
        a rate is known)."""
        rate = self.drain_rate()
        if rate is None or rate == math.inf:
            return None
        return max(1, math.ceil(seconds * rate / self._wait_factor - 1e-9))

    def slot_s(self) -> float:
        """The expected time until the next slot frees (0 before a rate is known): what a request
        loses if a slot it would have taken goes to another first."""
        rate = self.drain_rate()
        return self._wait_factor / rate if rate else 0.0

    def queue_full_s(self, ahead: int) -> float:
        """The Retry-After for a full class queue whose head waits behind `ahead` requests."""
        rate = self.drain_rate()
        if rate is None:
            return self.clamp(self._cfg.retry_after_min_s)
        return self.clamp((ahead + 1) / rate)

    def retry_after_s(self) -> float:
        """A Retry-After for rejections made outside the scheduler (e.g. no healthy backend):
        the expected time until the next completion, within the configured bounds."""
        rate = self.drain_rate()
        return self.clamp(1.0 / rate if rate else self._cfg.retry_after_min_s)

    def clamp(self, seconds: float) -> float:
        """A Retry-After within the configured bounds."""
        return min(self._cfg.retry_after_max_s, max(self._cfg.retry_after_min_s, seconds))


def misses_alone(service_s: float, budget_s: float, margin: float) -> bool:
    """Whether a request whose predicted TTFT once started is `service_s` misses its target
    (`margin` x the `budget_s` to its deadline) even with nothing ahead of it: then no wait is to
    blame, and it is never refused for its target, neither on arrival (`Admission.late_s`) nor
    once queued (`front.queue`): it is served late, as it would be alone."""
    return service_s > budget_s * margin
