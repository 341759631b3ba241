"""The exception tree errors.py draws is the one the classes make (httpx's `_exceptions.py` shape)."""

from __future__ import annotations

import re

import tailguard.errors as errors
from tailguard.front.events import ClockWentBack, FrontBroken, NotAnEvent, ProtocolError, WrongEvent
from tailguard.front.intake import Refused
from tailguard.gateway.classes import Unauthorized
from tailguard.gateway.sink import ClientGone
from tailguard.gateway.upstream.client import RelayError, Suspended, UpstreamStatus
from tailguard.gateway.upstream.h1 import UpstreamBroke

GATEWAY = (RelayError, UpstreamStatus, UpstreamBroke, ClientGone, Suspended)


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn: dict[str, str] = {}  # class -> parent, read from the column each name is drawn at
    parents: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        m = re.match(r"^    ([│├└─ ]*)([A-Z]\w+)(?:\s{2,}|$)", line)
        if m is None:
            continue
        depth = len(m.group(1)) // 4
        parents = parents[:depth]
        if parents:
            drawn[m.group(2)] = parents[-1]
        parents.append(m.group(2))
    front = (ProtocolError, WrongEvent, NotAnEvent, ClockWentBack, FrontBroken, Refused)
    classes = {c.__name__: c for c in (*GATEWAY, Unauthorized, *front)} | {
        n: c for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.TailguardError)}
    assert set(drawn) == set(classes) - {"TailguardError"}
    for name, parent in drawn.items():
        assert classes[name].__bases__ == (classes[parent],), name


def test_the_gateways_exceptions_are_tailguard_errors_and_no_api_error() -> None:
    # `except APIError` answers a client with an error body; none of these may be caught there.
    for cls in GATEWAY:
        assert issubclass(cls, errors.GatewayError) and not issubclass(cls, errors.APIError)
