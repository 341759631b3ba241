"""The rule file: which class each trace request belongs to, and the headers and body fields it
is sent with, so a replay exercises the gateway's classes; pure (the YAML read aside).

    # rules.yaml: the first class whose `when` matches takes the request
    classes:
      - name: api                       # BurstGPT's API traffic goes to the batch class
        when: {Log Type: API log}
        headers: {X-Tailguard-Class: batch}
      - name: long                      # so do long prompts
        when: {input_tokens: {min: 4000}}
        headers: {X-Tailguard-Class: batch}
      - name: chat                      # no `when`: everything else
        headers: {X-Tailguard-Class: interactive}
        slo: {ttft_s: 1.0}

A condition is on a column of the trace (`Log Type`, `Model`, an access log's `class`, ...) or on
a field every format has (`input_tokens`, `output_tokens`, `session`, `class`): a value (equal),
a list (one of them), or `{min, max}` (a number in range, both ends included) and `{matches}` (a
regular expression the value's text matches). A request no class takes is class `other`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tailguard.bench.trace.request import Scalar, TraceRequest
from tailguard.bench.workload import SLO, RequestClass
from tailguard.errors import ConfigError

UNMATCHED = "other"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Range(_Model):
    min: float | None = None
    max: float | None = None
    matches: str | None = None

    @field_validator("matches")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"matches {v!r} is not a regular expression: {e}") from None
        return v

    def holds(self, value: Scalar) -> bool:
        if self.matches is not None and (value is None or re.search(self.matches, str(value)) is None):
            return False
        if self.min is None and self.max is None:
            return True
        try:
            x = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        return (self.min is None or x >= self.min) and (self.max is None or x <= self.max)


Condition = Union[Range, list[Union[str, int, float, bool]], str, int, float, bool]


def _equal(value: Scalar, want: Scalar) -> bool:
    """Equal as written: a CSV column's text `4096` equals the number 4096."""
    if value == want:
        return True
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        try:
            return float(value) == float(want)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
    return str(value) == str(want) if value is not None else False


class TraceClass(_Model):
    name: str = Field(min_length=1)
    when: dict[str, Condition] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, Any] = Field(default_factory=dict)
    slo: SLO | None = None
    stream: bool = True

    def matches(self, r: TraceRequest) -> bool:
        for name, cond in self.when.items():
            value = r.value(name)
            if isinstance(cond, Range):
                ok = cond.holds(value)
            elif isinstance(cond, list):
                ok = any(_equal(value, c) for c in cond)
            else:
                ok = _equal(value, cond)
            if not ok:
                return False
        return True

    def request_class(self, ignore_eos: bool) -> RequestClass:
        """This class as the workload class the bench's reports and the DES read."""
        return RequestClass(name=self.name, headers=self.headers, body=self.body, slo=self.slo, stream=self.stream,
                            ignore_eos=ignore_eos)


class Rules(_Model):
    classes: list[TraceClass] = Field(min_length=1)

    def classify(self, r: TraceRequest) -> TraceClass | None:
        return next((c for c in self.classes if c.matches(r)), None)

    def check(self, fields: set[str], where: str) -> None:
        """A rule on a field the trace does not have is a misspelling: say so, with the fields it has."""
        for c in self.classes:
            unknown = sorted(set(c.when) - fields)
            if unknown:
                raise ConfigError(f"{where}: class {c.name!r} tests {', '.join(repr(u) for u in unknown)}, which the "
                                  f"trace does not have (its fields: {', '.join(sorted(fields))})")


def load_rules(path: str | Path) -> Rules:
    where = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{where}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a rule file is a mapping with 'classes'")
    try:
        rules = Rules.model_validate(data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{where}: invalid rules:\n  " + "\n  ".join(lines)) from None
    names = [c.name for c in rules.classes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{where}: class names must be unique, repeated: {dup}")
    return rules
