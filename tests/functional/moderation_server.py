"""A moderation service of the tests' own on loopback, in OpenAI's moderation shape (`POST
/v1/moderations`: `{input, model}` -> `{id, model, results: [{flagged, categories,
category_scores}]}`), as Llama Guard behind an adapter or any classifier would answer. What it
flags, how slowly it answers and whether it fails are the test's to set while it runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.servers import running

CATEGORIES = ("harassment", "hate", "self-harm", "sexual", "violence")


@dataclass
class Moderator:
    url: str = ""  # its /v1/moderations
    words: tuple[str, ...] = ("forbidden",)  # a text holding one of these is flagged as violence
    flag_from_call: int | None = None  # from this call on (1-based), every text is flagged
    delay_s: float = 0.0  # each answer waits this long
    status: int = 200  # another status: the service failing
    calls: int = 0
    inputs: list[list[str]] = field(default_factory=list)  # what each call was asked

    def result(self, text: str) -> dict[str, Any]:
        hit = any(w in text for w in self.words) or (self.flag_from_call is not None and
                                                      self.calls >= self.flag_from_call)
        cats = {c: hit and c == "violence" for c in CATEGORIES}
        return {"flagged": hit, "categories": cats, "category_scores": {c: 0.99 if v else 0.01 for c, v in cats.items()}}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        self.calls += 1
        self.inputs.append(texts)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "classifier down"}}, status=self.status)
        return web.json_response({"id": f"modr-{self.calls}", "model": body.get("model", "test-guard"),
                                  "results": [self.result(t) for t in texts]})


@asynccontextmanager
async def moderation_server() -> AsyncIterator[Moderator]:
    m = Moderator()
    app = web.Application()
    app.router.add_post("/v1/moderations", m.handle)
    async with running(app, handler_cancellation=True) as url:  # a caller that gives up ends its call
        m.url = f"{url}/v1/moderations"
        yield m
