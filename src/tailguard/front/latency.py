"""What a first token costs on each backend: an online fit of its TTFT from what the front sees;
pure, no I/O, told nothing but numbers.

An engine's step takes `a + b * prefill tokens + c * running sequences + d * context tokens read`
(the simulator's cost model, `sim.cost`, BLIS's and Vidur's shape). A request started on a backend
gets its first token once its prompt is prefilled: the rest of the step in flight, then the steps
that compute its uncached prompt beside the sequences already decoding. So its TTFT from the start
is, to a first order, linear in the same four terms, seen from the front:

    ttft_s ~ a + b * prefill + c * running + d * context + e * queued

- `prefill`: the request's uncached prompt tokens (its prompt less what the backend's prefix cache
  is expected to hold, `front.prefix`);
- `running`: the requests the gateway runs on that backend as it starts (`in_flight`, or the
  engine's own count while its reading is fresh);
- `context`: their tokens (prompt and output limit, the slot ledger's `tokens`): what each step reads;
- `queued`: the uncached prompt tokens of the requests started there before it whose first token
  has not come yet (`Latency.pending`): prefill the engine does before or beside its own. Its own
  term, not `b`'s: part of it is in the step already under way as the request starts.

Every unhedged request that ran once, undisturbed, is a sample (`FirstContent`, from its `Start`:
the gateway's queue wait is never in it). The fit is least squares over the samples with
exponential forgetting (a backend that slows down, a model swapped behind it, is followed within a
few hundred requests), a small ridge (a term the samples have not varied yet stays near zero rather
than wild) and no negative coefficient (a term that would come out negative is left out: more load
never makes a token come sooner). llm-d's latency predictor trains online on the same signals
(prefill size, running and waiting requests, KV use); Dynamo's planner fits prefill time per token.

    fit = TtftFit()
    fit.observe(prefill=800, running=6, context=9000, ttft_s=0.21, queued=0)   # each first token
    fit.predict(prefill=1200, running=7, context=9800, queued=500)              # seconds, or None until fitted

`Latency` holds one fit per backend; the front asks it, for a request, its TTFT once started on
each backend (`front.router`'s `predicted-ttft`, the deadline order and admission: `front.queue`).
"""

from __future__ import annotations

from dataclasses import dataclass

# What a start looks like to the fit: (uncached prompt tokens, requests running there, their tokens,
# the prefill still owed to the requests started there before it).
Features = tuple[float, float, float, float]

# Features are scaled to about 1 at a busy engine's values, so one ridge suits every term and the
# normal equations stay well conditioned: thousands of prompt tokens, tens of sequences, tens of
# thousands of context tokens.
_SCALE = (1.0, 1e-3, 0.1, 1e-4, 1e-3)
_TERMS = len(_SCALE)
# The normal equations' upper triangle, row by row, as one flat list: (i, j) of each entry.
_PAIRS = tuple((i, j) for i in range(_TERMS) for j in range(i, _TERMS))
_AT = {pair: k for k, pair in enumerate(_PAIRS)}
# Samples remembered: each is weighed this much less per later sample (an effective window of
# about 1 / (1 - _FORGET) = 200 requests).
_FORGET = 0.995
# Added to the diagonal of the scaled normal equations (per sample of weight): a term whose
# feature has not varied stays near zero, not at the value noise gives it.
_RIDGE = 1e-3
# Samples before the fit predicts anything (until then, nothing is refused or routed by it).
MIN_SAMPLES = 12
# After the first samples, the fit is solved again every this many samples (a solve per first
# token would be most of the front's work per request; forgetting moves the fit by about 1/200
# of its weight per sample, so a solve every 16 lags by a few per cent at most).
_REFIT_EVERY = 16


@dataclass(frozen=True, slots=True)
class Coefficients:
    """The fitted terms in their own units: seconds, per prefill token, per running request, per
    context token, per prefill token owed to requests started before."""

    a_s: float
    b_s_per_prefill_token: float
    c_s_per_running: float
    d_s_per_context_token: float
    e_s_per_queued_token: float


class TtftFit:
    """One backend's online least-squares fit (see the module docstring)."""

    __slots__ = ("_xtx", "_xty", "_weight", "samples", "_coef", "_since")

    def __init__(self) -> None:
        self._xtx = [0.0] * len(_PAIRS)  # the upper triangle of X'WX, flat (`_PAIRS`)
        self._xty = [0.0] * _TERMS
        self._weight = 0.0  # the samples' total weight, after forgetting
        self.samples = 0
        self._coef: list[float] | None = None
        self._since = 0  # samples since the last solve

    def observe(self, prefill: float, running: float, context: float, ttft_s: float, queued: float = 0.0) -> None:
        x = (1.0, prefill * _SCALE[1], running * _SCALE[2], context * _SCALE[3], queued * _SCALE[4])
        self._xtx = [v * _FORGET + x[i] * x[j] for v, (i, j) in zip(self._xtx, _PAIRS)]
        self._xty = [v * _FORGET + xi * ttft_s for v, xi in zip(self._xty, x)]
        self._weight = self._weight * _FORGET + 1.0
        self.samples += 1
        self._since += 1
        if self.samples >= MIN_SAMPLES and (self._coef is None or self._since >= _REFIT_EVERY
                                             or self.samples < 4 * MIN_SAMPLES):
            self._solve()

    def predict(self, prefill: float, running: float, context: float, queued: float = 0.0) -> float | None:
        """Seconds from a start to the first token, or None until `MIN_SAMPLES` were seen."""
        c = self._coef
        if c is None:
            return None
        return (c[0] + c[1] * prefill * _SCALE[1] + c[2] * running * _SCALE[2] + c[3] * context * _SCALE[3]
                + c[4] * queued * _SCALE[4])

    @property
    def fitted(self) -> bool:
        """Whether it predicts (`MIN_SAMPLES` seen and solved)."""
        return self._coef is not None

    def mean_s(self) -> float | None:
        """The mean TTFT from a start of the samples it remembers (weighed as the fit weighs them),
        which the fit predicts at their mean features; None before any sample."""
        w = self._xtx[0]
        return self._xty[0] / w if w > 0 else None

    def coefficients(self) -> Coefficients | None:
        c = self._coef
        if c is None:
            return None
        return Coefficients(*(v * s for v, s in zip(c, _SCALE)))

    def _solve(self) -> None:
        """Non-negative ridge least squares: solve, leave out any term that comes out negative,
        solve the rest again (at most once per term)."""
        self._since = 0
        active = list(range(_TERMS))
        while active:
            coef = _solve(self._system(active))
            if coef is None:
                return  # singular even with the ridge: keep the last fit
            negative = [t for t, v in zip(active, coef) if v < 0.0]
            if not negative:
                full = [0.0] * _TERMS
                for t, v in zip(active, coef):
                    full[t] = v
                self._coef = full
                return
            active = [t for t in active if t not in negative]

    def _system(self, active: list[int]) -> list[list[float]]:
        """The augmented normal equations of the `active` terms (the upper triangle mirrored)."""
        xtx, ridge = self._xtx, _RIDGE * self._weight
        rows = []
        for i in active:
            row = [xtx[_AT[min(i, j), max(i, j)]] + (ridge if i == j and i else 0.0) for j in active]
            rows.append([*row, self._xty[i]])
        return rows


def _solve(m: list[list[float]]) -> list[float] | None:
    """Gaussian elimination with partial pivoting of an augmented n x (n+1) system, in place."""
    n = len(m)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        p = m[col]
        for r in range(col + 1, n):
            f = m[r][col] / p[col]
            if f:
                row = m[r]
                for k in range(col, n + 1):
                    row[k] -= f * p[k]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        s = m[r][n] - sum(m[r][k] * out[k] for k in range(r + 1, n))
        out[r] = s / m[r][r]
    return out


class Latency:
    """Each backend's `TtftFit`, by name, made as its first sample comes, and the prefill each
    backend still has to do for the requests started there (`started` .. `prefilled`)."""

    __slots__ = ("_fits", "_prefilling", "_pending")

    def __init__(self) -> None:
        self._fits: dict[str, TtftFit] = {}
        self._prefilling: dict[str, dict[str, float]] = {}  # backend -> request -> its uncached prompt
        self._pending: dict[str, float] = {}  # backend -> the sum of those

    def started(self, backend: str, req_id: str, prefill: float) -> None:
        """`req_id` started on `backend` with `prefill` uncached prompt tokens to compute."""
        self._prefilling.setdefault(backend, {})[req_id] = prefill
        self._pending[backend] = self._pending.get(backend, 0.0) + prefill

    def prefilled(self, backend: str, req_id: str) -> None:
        """`req_id`'s prompt on `backend` is computed (its first token came), or it left there."""
        tokens = self._prefilling.get(backend, {}).pop(req_id, None)
        if tokens is not None:
            self._pending[backend] -= tokens

    def pending(self, backend: str) -> float:
        """The prefill tokens `backend` still has to compute for requests started there."""
        return max(0.0, self._pending.get(backend, 0.0))

    def observe(self, backend: str, x: Features, ttft_s: float) -> bool:
        """A first token `ttft_s` after a start with features `x`; True when it is the sample
        that lets `backend`'s fit predict for the first time."""
        fit = self._fits.get(backend)
        if fit is None:
            fit = self._fits[backend] = TtftFit()
        before = fit.fitted
        fit.observe(x[0], x[1], x[2], ttft_s, x[3])
        return not before and fit.fitted

    def predict(self, backend: str, x: Features) -> float | None:
        """Seconds from a start on `backend` with features `x` to the first token (None: not fitted)."""
        fit = self._fits.get(backend)
        return None if fit is None else fit.predict(x[0], x[1], x[2], x[3])

    def fit(self, backend: str) -> TtftFit | None:
        return self._fits.get(backend)

    def forget(self, backend: str) -> None:
        self._fits.pop(backend, None)
        self._prefilling.pop(backend, None)
        self._pending.pop(backend, None)
