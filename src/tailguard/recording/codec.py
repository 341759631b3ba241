"""A recording of the front's conversation with its driver, as JSON lines and back; pure, no I/O.

`tailguard serve --record FILE` writes one JSON object per line (`tailguard.gateway.ops.recorder`):

    {"format": "tailguard-front-recording", "version": 1, "params": {...FrontParams...},
     "config": {"hash": "...", "settings": {...}}, "clock": {...}}                  the header, once
    {"now": 812.25, "preempt": true, "event": {"type": "Arrive", "id": "r1", ...},
     "decisions": [{"type": "Start", "id": "r1", "backend": "sim", "resumed": false}]}  one per event
    {"request": {"id": "r1", "cls": "batch", "prompt_tokens": 100, ...}}         one per request, as it ends

Events and decisions are the front's own values (`front.events`) with their type's name; enums
are their values; `now` is the instant the driver told the front. A `request` line is what the
front does not need but a what-if does (sizes, backend, first-content and finish instants, on the
clock of `now`). No prompt text and no keys: callers are names already, and the config's secrets
are fingerprints (`GatewayConfig.settings`).

Reading is strict, so a replay never runs on a file it misread: an unknown line, type or field, a
missing field or a value of the wrong type is a `RecordingError` that names the line.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

from tailguard.errors import TailguardError
from tailguard.front.events import Decision, Event
from tailguard.front.params import FrontParams
from tailguard.recording import legacy
from tailguard.types import Outcome

FORMAT = "tailguard-front-recording"
VERSION = 2  # 2: decisions that say everything (Start's mode, GiveUp, Drop's winner); 1 is read too (`legacy`)

EVENT_TYPES: dict[str, type] = {t.__name__: t for t in typing.get_args(Event)}
DECISION_TYPES: dict[str, type] = {t.__name__: t for t in typing.get_args(Decision)}


class RecordingError(TailguardError):
    """A recording that cannot be read as one: names the line and what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What the driver saw of one request when it ended, on the front's clock: what a what-if
    needs and the front does not (its sizes, where it ran, when its first content came)."""

    id: str
    cls: str
    outcome: Outcome
    prompt_tokens: int
    output_tokens: int
    arrived_at: float
    finished_at: float
    bound_at: float | None = None
    first_content_at: float | None = None
    backend: str | None = None
    caller: str | None = None
    # What the front's decisions said of it (`front.counts`).
    attempts: int = 0
    preemptions: int = 0
    retries: int = 0
    retries_denied: int = 0
    migrations: int = 0
    hedges: int = 0
    hedges_won: int = 0


@dataclass(frozen=True, slots=True)
class Header:
    """The recording's first line: the parameters the front was built from, the gateway config's
    hash and settings (None when not known), and how its clock was read (free-form)."""

    params: FrontParams
    config_hash: str | None = None
    settings: Mapping[str, Any] | None = None
    clock: Mapping[str, Any] | None = None
    version: int = VERSION  # of the format it was read from (a recording is written in VERSION only)


@dataclass(frozen=True, slots=True)
class Step:
    """One event as the driver handed it to the front (`line` in the file), and what it decided."""

    line: int
    event: Event
    now: float
    preempt: bool
    decisions: tuple[Any, ...]  # as the recording's version wrote them (`legacy` for version 1)


@dataclass(frozen=True, slots=True)
class Recording:
    header: Header
    steps: tuple[Step, ...]
    requests: tuple[Observation, ...]


# --- writing ----------------------------------------------------------------------------------

def header_line(header: Header) -> dict[str, Any]:
    config = None if header.config_hash is None and header.settings is None else {
        "hash": header.config_hash, "settings": dict(header.settings) if header.settings is not None else None}
    return {"format": FORMAT, "version": VERSION, "params": _plain(header.params), "config": config,
            "clock": dict(header.clock) if header.clock is not None else None}


def step_line(event: Event, now: float, preempt: bool, decisions: Sequence[Decision]) -> dict[str, Any]:
    return {"now": now, "preempt": preempt, "event": _tagged(event), "decisions": [_tagged(d) for d in decisions]}


def request_line(obs: Observation) -> dict[str, Any]:
    return {"request": _plain(obs)}


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _plain(v: Any) -> Any:
    """`v` as JSON-able values: a dataclass as a dict of its fields, an enum as its value."""
    t = type(v)
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    if isinstance(v, enum.Enum):
        return v.value
    if is_dataclass(v):
        return _fields(v, {})
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(_plain(k)): _plain(x) for k, x in v.items()}
    raise TypeError(f"cannot record a {t.__name__}: {v!r}")


def _tagged(v: Any) -> dict[str, Any]:
    return _fields(v, {"type": type(v).__name__})


def _fields(v: Any, out: dict[str, Any]) -> dict[str, Any]:
    """`v`'s fields into `out`; scalars as they are without a call (a line per event and request
    is built on the gateway's loop)."""
    for name in _names(type(v)):
        x = getattr(v, name)
        t = type(x)
        out[name] = x if t is str or t is int or t is float or t is bool or x is None else _plain(x)
    return out


# --- reading ----------------------------------------------------------------------------------

def read(lines: Iterable[str]) -> Recording:
    """A recording from its lines (blank lines are skipped). Raises `RecordingError`."""
    header: Header | None = None
    decision_types = DECISION_TYPES
    steps: list[Step] = []
    requests: list[Observation] = []
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except ValueError as e:
            raise RecordingError(f"line {n}: not JSON ({e})") from None
        try:
            if header is None:
                header = _header(data)
                if header.version == legacy.VERSION:
                    decision_types = {**{k: v for k, v in DECISION_TYPES.items() if k not in legacy.GONE_SINCE},
                                      **legacy.RENAMED}
            elif isinstance(data, dict) and "request" in data:
                _keys(data, {"request"}, set(), "the line")
                requests.append(_decode(Observation, data["request"], "request"))
            else:
                steps.append(_step(n, data, decision_types))
        except RecordingError as e:
            raise RecordingError(f"line {n}: {e}") from None
    if header is None:
        raise RecordingError("empty recording: no header line")
    return Recording(header, tuple(steps), tuple(requests))


def _header(data: Any) -> Header:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RecordingError(f"not a front recording: the first line must be a header with format {FORMAT!r}")
    _keys(data, {"format", "version", "params"}, {"config", "clock"}, "the header")
    version = data["version"]
    if version not in (legacy.VERSION, VERSION):
        raise RecordingError(f"recording format version {version!r}; this tailguard reads versions "
                             f"{legacy.VERSION} and {VERSION}")
    params = _decode(FrontParams, data["params"], "params")
    config = data.get("config")
    hash_, settings = None, None
    if config is not None:
        _keys(config, {"hash", "settings"}, set(), "config")
        hash_ = _decode(str | None, config["hash"], "config.hash")
        settings = _mapping(config["settings"], "config.settings")
    return Header(params, hash_, settings, _mapping(data.get("clock"), "clock"), version)


def _mapping(v: Any, where: str) -> Mapping[str, Any] | None:
    if v is not None and not isinstance(v, dict):
        raise RecordingError(f"{where}: expected an object or null, got {v!r}")
    return v


def _step(n: int, data: Any, decision_types: dict[str, type]) -> Step:
    _keys(data, {"now", "preempt", "event", "decisions"}, set(), "the line")
    now = _decode(float, data["now"], "now")
    preempt = _decode(bool, data["preempt"], "preempt")
    event = _typed(data["event"], EVENT_TYPES, "event")
    decisions = data["decisions"]
    if not isinstance(decisions, list):
        raise RecordingError(f"decisions: expected a list, got {decisions!r}")
    return Step(n, event, now, preempt, tuple(_typed(d, decision_types, f"decisions[{i}]")
                                               for i, d in enumerate(decisions)))


def _typed(data: Any, table: dict[str, type], where: str) -> Any:
    if not isinstance(data, dict) or "type" not in data:
        raise RecordingError(f"{where}: expected an object with a type, got {data!r}")
    cls = table.get(data["type"])
    if cls is None:
        raise RecordingError(f"{where}: unknown type {data['type']!r} (known: {', '.join(table)})")
    return _decode(cls, {k: v for k, v in data.items() if k != "type"}, f"{where} {data['type']}")


def _keys(data: Any, required: set[str], optional: set[str], where: str) -> None:
    if not isinstance(data, dict):
        raise RecordingError(f"{where}: expected an object, got {data!r}")
    unknown = sorted(set(data) - required - optional)
    if unknown:
        raise RecordingError(f"{where}: unknown field(s) {', '.join(unknown)} (known: "
                             f"{', '.join(sorted(required | optional))})")
    missing = sorted(required - set(data))
    if missing:
        raise RecordingError(f"{where}: missing field(s) {', '.join(missing)}")


_HINTS: dict[type, dict[str, Any]] = {}


def _decode(tp: Any, v: Any, where: str) -> Any:
    """`v` read as type `tp` (a dataclass, an enum, a scalar, a `Literal`, `X | None`,
    `Sequence[X]` or `Mapping[K, V]`)."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        if v not in typing.get_args(tp):
            raise RecordingError(f"{where}: {v!r} is not one of {', '.join(map(repr, typing.get_args(tp)))}")
        return v
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        if not isinstance(v, dict):
            raise RecordingError(f"{where}: expected an object, got {v!r}")
        kt, vt = typing.get_args(tp)
        return {_decode(kt, k, f"{where} key"): _decode(vt, x, f"{where}.{k}") for k, x in v.items()}
    if origin is types.UnionType or origin is typing.Union:
        args = typing.get_args(tp)
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, v, where)
    if origin is not None and isinstance(origin, type) and issubclass(origin, Sequence):
        if not isinstance(v, list):
            raise RecordingError(f"{where}: expected a list, got {v!r}")
        (inner,) = [a for a in typing.get_args(tp) if a is not Ellipsis]  # tuple[X, ...] too
        items = [_decode(inner, x, f"{where}[{i}]") for i, x in enumerate(v)]
        return tuple(items) if origin is tuple else items
    if is_dataclass(tp):
        assert isinstance(tp, type)
        hints = _HINTS.get(tp)
        if hints is None:
            hints = _HINTS[tp] = typing.get_type_hints(tp)
        fs = fields(tp)
        _keys(v, {f.name for f in fs if f.default is MISSING and f.default_factory is MISSING},
              {f.name for f in fs}, where)
        return tp(**{k: _decode(hints[k], x, f"{where}.{k}") for k, x in v.items()})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(v)
        except ValueError:
            raise RecordingError(f"{where}: {v!r} is not a {tp.__name__} (known: "
                                 f"{', '.join(str(m.value) for m in tp)})") from None
    if tp is float and type(v) in (int, float):
        return float(v)
    if tp in (str, int, bool) and type(v) is tp:
        return v
    raise RecordingError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {v!r}")
