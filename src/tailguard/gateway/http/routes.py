"""The API routes the gateway serves beyond chat and completions, each an `Endpoint` through the
same proxy (classes, queue, slots, limits, metering), and the error shape each route answers in:
Anthropic's under `/v1/messages` (its SDK reads `error.type`), OpenAI's everywhere else.

    for path, endpoint in API_ROUTES.items(): app.router.add_post(path, handler(endpoint))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping

import orjson
from aiohttp import web

from tailguard.errors import APIError
from tailguard.wire import anthropic
from tailguard.wire.openai import Endpoint, error_body, error_headers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Path -> the endpoint it is; `/rerank` is vLLM's and llama-server's name for `/v1/rerank`.
API_ROUTES: dict[str, Endpoint] = {
    "/v1/responses": "responses", "/v1/messages": "messages", "/v1/embeddings": "embeddings",
    "/v1/rerank": "rerank", "/rerank": "rerank", "/score": "score", "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}
ANTHROPIC_PREFIX = "/v1/messages"


def anthropic_shaped(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def shaped_error(err: APIError, path: str, extra: dict[str, str] | None = None) -> web.Response:
    """`err` in the shape the clients of the route at `path` read."""
    headers = error_headers(err)
    if extra:
        headers.update(extra)
    body = anthropic.error_body(err) if anthropic_shaped(path) else error_body(err)
    return web.Response(status=err.status, body=body, content_type="application/json", headers=headers)


def error_shape(endpoint: Endpoint) -> Callable[[APIError], bytes]:
    """How an error is written for the clients of `endpoint`: Anthropic's shape on its Messages
    route, OpenAI's everywhere else."""
    return anthropic.error_body if endpoint == "messages" else error_body


def anthropic_refusal(status: int, body: bytes) -> bytes:
    """A backend's refusal as the Messages route answers it: an OpenAI-shaped body (the gateway's
    sanitized one, or an engine's) in Anthropic's shape; one already in Anthropic's as it came."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict) or data.get("type") == "error":
        return body
    return anthropic.error_body(APIError(str(err.get("message", "")), status=status))


def served(router: web.UrlDispatcher) -> list[str]:
    """`METHOD /path` of every route the app serves (HEAD, which aiohttp adds to GETs, left out)."""
    out: list[str] = []
    for route in router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if route.method != "HEAD" and path:
            out.append(f"{route.method} {path}")
    return out


def not_found_message(method: str, path: str, routes: Iterable[str]) -> str:
    return f"Not Found: {method} {path}. The gateway serves: {', '.join(routes)}."
