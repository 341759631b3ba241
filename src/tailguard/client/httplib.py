"""The HTTP library the installed openai SDK is built on, which the transports must subclass:
openai 3 is built on httpx2, openai 1 and 2 on httpx (the same API under its older name). Chosen
once, at import, from the SDK's major version, so the client fits an application pinned to
either; type checking reads httpx2's."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import openai

if TYPE_CHECKING:
    import httpx2 as httpx
else:
    httpx = importlib.import_module("httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx")

__all__ = ["httpx"]
