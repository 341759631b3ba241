"""Shared aliases and small enums used by every part; a leaf module."""

from __future__ import annotations

import enum
from typing import TypeAlias

Seconds: TypeAlias = float
ClassName: TypeAlias = str


class Outcome(str, enum.Enum):
    """How a request ended. Every accepted request ends exactly once, with one of these."""

    SUCCESS = "success"
    CLIENT_ERROR = "client_error"
    REJECTED = "rejected"
    UPSTREAM_ERROR = "upstream_error"
    TIMEOUT = "timeout"
    CLIENT_GONE = "client_gone"
