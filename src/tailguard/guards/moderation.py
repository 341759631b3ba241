"""The operator's moderation service as a check: OpenAI's moderation shape, which Llama Guard,
ShieldGemma or any classifier served behind a small adapter (or vLLM's own classification
routes) can speak.

    POST {url}   {"input": ["text", ...], "model": "..."}     (model only when configured)
    200          {"results": [{"flagged": true, "categories": {"violence": true, ...}}, ...]}

A request is flagged when any result is: by the service's own `flagged`, or, with `categories`
configured, when one of those categories is true. Anything else (a status other than 200, a
body that is not that shape, more than `MAX_ANSWER_BYTES`, a connection refused) is the check
failing, and the guard's `on_error` decides. Its deadline is the guard's `timeout_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

from tailguard.capped import read_capped
from tailguard.guards.check import CLEAN, Finding

MAX_ANSWER_BYTES = 1 << 20


class CheckFailed(Exception):
    """The service did not answer in its shape: what it did instead, with no text of the request."""


class Moderation:
    """The HTTP client every moderation check of a gateway shares (one keep-alive pool), made on
    the running loop when first used and closed with the gateway."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=30),
                                                  raise_for_status=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class ModerationCheck:
    """One guard's moderation service."""

    def __init__(self, client: Moderation, url: str, *, api_key: str | None = None, model: str | None = None,
                 categories: Sequence[str] | None = None, window_chars: int = 256) -> None:
        self._client, self.url, self._model = client, url, model
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._categories = frozenset(categories) if categories is not None else None
        self.step_chars = max(1, window_chars // 2)

    def inline(self, texts: Sequence[str]) -> Finding | None:
        return None

    async def run(self, texts: Sequence[str]) -> Finding:
        if not texts:
            return CLEAN
        body: dict[str, Any] = {"input": list(texts)}
        if self._model is not None:
            body["model"] = self._model
        async with self._client.session().post(self.url, data=orjson.dumps(body), headers=self._headers) as resp:
            if resp.status != 200:
                raise CheckFailed(f"answered {resp.status}")
            raw = await read_capped(resp, MAX_ANSWER_BYTES)
        return self.finding(raw)

    def finding(self, raw: bytes) -> Finding:
        """The service's answer as a finding; `CheckFailed` unless it is OpenAI's shape."""
        try:
            results = orjson.loads(raw)["results"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise CheckFailed("answered something other than OpenAI's moderation shape") from None
        if not isinstance(results, list) or not results:
            raise CheckFailed("answered no results")
        flagged, found = False, set()
        for r in results:
            if not isinstance(r, dict) or not isinstance(r.get("flagged"), bool):
                raise CheckFailed("answered a result without `flagged`")
            cats = r.get("categories")
            true = {str(k) for k, v in cats.items() if v is True} if isinstance(cats, dict) else set()
            if self._categories is None:
                flagged = flagged or r["flagged"]
                found |= true if r["flagged"] else set()
            else:
                hit = true & self._categories
                flagged = flagged or bool(hit)
                found |= hit
        return Finding(flagged, tuple(sorted(found))) if flagged else CLEAN
