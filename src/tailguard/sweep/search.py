"""One setting at a time against a per-class P99 SLO (pure, no I/O): the settings a sweep can
move and where each lives in the gateway's YAML or the simulator's engine config, the value
lists, the repeat rule, the knee and the recommendation.

The driver (the DES in `sweep/virtual.py`, processes in `cli/sweep.py`) asks `Sweep.next_run()`
for the next (value, seed) to measure and hands each run's `summary.json` back with `add`; a
value is repeated with a new seed until the 95% interval of its P99 is within `tolerance` of the
mean (or `max_repeats`), as GuideLLM and AIPerf repeat a point until it is stable.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from statistics import mean, stdev
from typing import Any

from tailguard.errors import ConfigError
from tailguard.config import GatewayConfig

GATEWAY_SETTINGS = ("max_concurrency", "max_tokens_cap", "policy", "aging_s", "preemption", "fair_share")
SLOTS = ("max_concurrency", "max_num_seqs")  # caps on requests at once: closed-loop clients bound them
METRICS = ("e2e_s", "ttft_s", "itl_s", "tpot_s")
ENGINE_SETTINGS = ("max_num_seqs", "prefix_caching")  # only when the engine is the simulator
NUMERIC = ("max_concurrency", "max_tokens_cap", "aging_s", "max_num_seqs")
# Two-sided 95% Student t quantiles by degrees of freedom (n - 1): repeats are few.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
NEAR_BEST = 0.02  # within 2% of the best throughput is a tie: the smaller value wins


@dataclass(frozen=True)
class Setting:
    """`max_concurrency`, or `max_tokens_cap:batch` (a class's cap)."""

    name: str
    cls: str | None = None

    @classmethod
    def parse(cls, text: str) -> Setting:
        name, _, of = text.partition(":")
        if name not in GATEWAY_SETTINGS + ENGINE_SETTINGS:
            raise ConfigError(f"--setting {text!r}: known settings are {', '.join(GATEWAY_SETTINGS + ENGINE_SETTINGS)}")
        if (name == "max_tokens_cap") != bool(of):
            raise ConfigError("max_tokens_cap takes its class: --setting max_tokens_cap:batch")
        return cls(name, of or None)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.cls}" if self.cls else self.name

    @property
    def on_engine(self) -> bool:
        return self.name in ENGINE_SETTINGS


def parse_values(setting: Setting, text: str) -> list[Any]:
    """`2..32` (every integer), `2..32:x2` (doubling), `2..32:4` (step 4), or a list `1,5,10`;
    `on,off` for preemption, fair sharing and prefix caching, policy names for the policy."""
    if setting.name in ("preemption", "prefix_caching", "fair_share"):
        flags = {"on": True, "true": True, "off": False, "false": False}
        try:
            return [flags[v.strip().lower()] for v in text.split(",")]
        except KeyError:
            raise ConfigError(f"--values for {setting.name}: on,off") from None
    if setting.name == "policy":
        return [v.strip() for v in text.split(",")]
    try:
        if ".." in text:
            span, _, step = text.partition(":")
            lo, hi = (int(x) for x in span.split(".."))
            if step.startswith("x"):
                out, v = [], lo
                while v <= hi:
                    out.append(v)
                    v *= int(step[1:])
                return out
            return list(range(lo, hi + 1, int(step) if step else 1))
        return [float(v) if setting.name == "aging_s" else int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"--values {text!r}: a list (1,2,4), a range (2..32) or a doubling range (2..32:x2)") from None


def _default_classes() -> list[dict[str, Any]]:
    """The classes `tailguard serve` runs with when its config names none, as YAML settings."""
    cfg = GatewayConfig.model_validate({"backends": [{"name": "b", "url": "http://127.0.0.1:1"}]})
    return [c.model_dump(mode="json") for c in cfg.classes]


def apply(setting: Setting, value: Any, gateway: dict[str, Any], engine: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gateway YAML settings and the engine overrides with `setting` set to `value` (copies)."""
    gw, eng = copy.deepcopy(gateway), dict(engine)
    if setting.name == "max_concurrency":
        for b in gw.setdefault("backends", [{}]):
            b["max_concurrency"] = value
    elif setting.name == "max_tokens_cap":
        classes = gw.setdefault("classes", _default_classes())
        match = [c for c in classes if c["name"] == setting.cls]
        if not match:
            known = ", ".join(c["name"] for c in classes)
            raise ConfigError(f"--setting {setting.label}: no class {setting.cls!r} in the gateway config (its classes: "
                              f"{known}); name one of them, or give --config with the class")
        match[0]["max_tokens_cap"] = value
    elif setting.name in ("policy", "aging_s", "preemption", "fair_share"):
        gw.setdefault("scheduler", {})[setting.name] = value
    elif setting.name == "max_num_seqs":
        eng["max_num_seqs"] = value
    else:
        eng["enable_prefix_caching"] = value
    return gw, eng


@dataclass(frozen=True)
class Slo:
    """`chat:e2e_s=2.0`: the class's P99 of that metric must stay at or under the bound."""

    cls: str
    metric: str
    bound_s: float

    @classmethod
    def parse(cls, text: str) -> Slo:
        try:
            name, rest = text.split(":", 1)
            metric, bound = rest.split("=", 1)
            slo = cls(name, metric, float(bound))
        except ValueError:
            raise ConfigError(f"--slo {text!r}: CLASS:METRIC=SECONDS, e.g. chat:e2e_s=2.0") from None
        if slo.metric not in METRICS:
            raise ConfigError(f"--slo {text!r}: the metric is one of e2e_s, ttft_s, itl_s, tpot_s")
        return slo


def p99(summary: dict[str, Any], cls: str, metric: str) -> float | None:
    v = summary.get("classes", {}).get(cls, {}).get(metric, {}).get("p99")
    return float(v) if isinstance(v, (int, float)) else None


def throughput(summary: dict[str, Any]) -> float:
    return float(summary.get("throughput", {}).get("output_tokens_per_s") or 0.0)


def interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (inf for a single run)."""
    if len(xs) < 2:
        return (xs[0] if xs else math.nan), math.inf
    return mean(xs), T95.get(len(xs) - 1, 1.96) * stdev(xs) / math.sqrt(len(xs))


@dataclass
class Point:
    value: Any
    summaries: list[dict[str, Any]] = field(default_factory=list)

    def p99s(self, cls: str, metric: str) -> list[float]:
        return [v for s in self.summaries if (v := p99(s, cls, metric)) is not None]

    def throughput(self) -> float:
        return mean(throughput(s) for s in self.summaries) if self.summaries else 0.0


@dataclass
class Sweep:
    setting: Setting
    values: list[Any]
    slos: list[Slo]
    seed: int = 0
    min_repeats: int = 2
    max_repeats: int = 5
    tolerance: float = 0.1
    clients: int | None = None  # a closed loop's clients; None in an open loop
    points: list[Point] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.values:
            raise ConfigError("--values gave no value: give a list (1,2,4) or a range (2..32)")
        if not 1 <= self.min_repeats <= self.max_repeats:
            raise ConfigError(f"--min-repeats {self.min_repeats} and --max-repeats {self.max_repeats}: "
                              "give 1 <= min <= max")
        self.points = [Point(v) for v in self.values]

    def watched(self, summary: dict[str, Any]) -> list[tuple[str, str]]:
        """(class, metric) pairs whose P99 must settle: the SLO's, else the overall E2E."""
        return [(s.cls, s.metric) for s in self.slos] or [("overall", "e2e_s")]

    def settled(self, pt: Point) -> bool:
        n = len(pt.summaries)
        if n < self.min_repeats:
            return False
        if n >= self.max_repeats:
            return True
        for cls, metric in self.watched(pt.summaries[0]):
            xs = pt.p99s(cls, metric) if cls != "overall" else [
                float(s["overall"][metric]["p99"]) for s in pt.summaries if s["overall"][metric]["p99"] is not None]
            m, half = interval(xs)
            if not m or half > self.tolerance * m:
                return False
        return True

    def next_run(self) -> tuple[int, Any, int] | None:
        """(point index, value, seed) of the next run, or None when every value has settled."""
        for i, pt in enumerate(self.points):
            if not self.settled(pt):
                return i, pt.value, self.seed + len(pt.summaries)
        return None

    def runs_left(self) -> int:
        """Runs still needed at the least: each unsettled value up to its minimum, or one more."""
        return sum(max(1, self.min_repeats - len(pt.summaries)) for pt in self.points if not self.settled(pt))

    def unbound(self) -> list[Any]:
        """The values of a slot cap at or above the clients sent: nothing ever waits for such a
        cap, so they all measure the same thing."""
        if self.clients is None or self.setting.name not in SLOTS:
            return []
        return [v for v in self.values if v >= self.clients]

    def add(self, index: int, summary: dict[str, Any]) -> None:
        self.points[index].summaries.append(summary)

    def meets(self, pt: Point) -> bool:
        """Every SLO's class P99 (mean over repeats) at or under its bound."""
        for s in self.slos:
            xs = pt.p99s(s.cls, s.metric)
            if not xs or mean(xs) > s.bound_s:
                return False
        return True


def knee(xs: list[float], ys: list[float]) -> int | None:
    """Kneedle's knee of a rising, flattening curve: the point farthest above the chord from
    the first to the last point, both axes scaled to [0, 1]. None for fewer than three points
    or a curve with no such point (`knee_or_why` says which)."""
    return knee_or_why(xs, ys)[0]


def knee_or_why(xs: list[float], ys: list[float]) -> tuple[int | None, str]:
    """The knee's index, or None and a sentence saying why there is none."""
    if len(xs) < 3:
        return None, f"a knee needs three values or more ({len(xs)} measured)"
    if max(xs) == min(xs):
        return None, "every value is the same"
    if max(ys) == min(ys):
        return None, "throughput is the same at every value: this setting does not limit it under this load"
    xn = [(x - xs[0]) / (xs[-1] - xs[0]) for x in xs]
    yn = [(y - min(ys)) / (max(ys) - min(ys)) for y in ys]
    chord = [yn[0] + (yn[-1] - yn[0]) * x for x in xn]
    gaps = [y - c for y, c in zip(yn, chord)]
    best = max(range(len(xs)), key=lambda i: gaps[i])
    if gaps[best] <= 0:
        return None, ("throughput does not flatten over these values (it rises at least as fast at the end): "
                      "sweep larger values")
    return best, ""


def _metrics(sw: Sweep) -> list[str]:
    """The P99s a point keeps: E2E and TTFT always, and whatever an SLO judges."""
    return [m for m in METRICS if m in ("e2e_s", "ttft_s") or any(s.metric == m for s in sw.slos)]


def _knee(sw: Sweep, rows: list[dict[str, Any]]) -> tuple[Any, str]:
    if sw.setting.name not in NUMERIC:
        return None, f"{sw.setting.label} is not a number: its values have no knee"
    k, why = knee_or_why([float(v) for v in sw.values], [r["throughput_tokens_per_s"] for r in rows])
    return (None, why) if k is None else (sw.values[k], "")


def result(sw: Sweep) -> dict[str, Any]:
    """sweep.json: every value's measurements, the knee and the recommendation with its reason."""
    rows = []
    for pt in sw.points:
        row: dict[str, Any] = {"value": pt.value, "runs": len(pt.summaries), "throughput_tokens_per_s": pt.throughput(),
                               "meets_slo": sw.meets(pt), "p99": {}}
        for cls in sorted({c for s in pt.summaries for c in s.get("classes", {})}):
            row["p99"][cls] = {}
            for m in _metrics(sw):
                mu, half = interval(pt.p99s(cls, m))
                row["p99"][cls][m] = {"mean": None if math.isnan(mu) else mu, "ci95_half": None if math.isinf(half) else half}
        rows.append(row)
    k, no_knee = _knee(sw, rows)
    ok = [r for r in rows if r["meets_slo"]]
    rec, why = None, "no value meets the SLO: offer less load, or sweep another setting"
    if ok:
        best = max(r["throughput_tokens_per_s"] for r in ok)
        rec = next(r for r in ok if r["throughput_tokens_per_s"] >= (1 - NEAR_BEST) * best)
        why = (f"the {'smallest ' if sw.setting.name in NUMERIC else ''}value within {NEAR_BEST:.0%} of the most "
               f"throughput ({best:.0f} tokens/s) among those meeting " +
               (", ".join(f"{s.cls} P99 {s.metric} <= {s.bound_s:g} s" for s in sw.slos) or "no SLO (none given)"))
    return {"setting": sw.setting.label, "values": sw.values, "slo": [vars(s) for s in sw.slos], "points": rows,
            "knee": k, "no_knee": no_knee, "recommended": None if rec is None else rec["value"],
            "reason": why, "warnings": _warnings(sw)}


def _warnings(sw: Sweep) -> list[str]:
    return _unmeasured(sw) + _unbound(sw)


def _unmeasured(sw: Sweep) -> list[str]:
    """An SLO on a class the runs do not have can never be met: say so, with the classes they have."""
    have = sorted({c for pt in sw.points for s in pt.summaries for c in s.get("classes", {})})
    if not have:
        return []
    return [f"--slo {s.cls}:{s.metric}={s.bound_s:g} judges class {s.cls!r}, which the workload does not send (its "
            f"classes: {', '.join(have)}): no value can meet it; name one of those" for s in sw.slos if s.cls not in have]


def _unbound(sw: Sweep) -> list[str]:
    same = sw.unbound()
    if not same:
        return []
    return [f"{sw.setting.label} {', '.join(str(v) for v in same)}: at or above the {sw.clients} clients sent, such "
            f"a cap never binds, so {'these values measure' if len(same) > 1 else 'this value measures'} the same "
            f"thing as no cap; send more clients than the largest value (--concurrency) or sweep values below "
            f"{sw.clients}"]
