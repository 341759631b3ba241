"""An answer relayed whole: the routes that answer once (embeddings, rerank, score, tokenize,
detokenize) and a non-stream Responses or Messages call, forwarded as the client sent it. The body
is read within its bound (`gateway.upstream.bound`: what its `max_tokens` allows, at most
`limits.max_answer_bytes`), checked to be the route's JSON (a JSON object; a Response or a Message
where the route says so), parsed once for its usage (what the request is metered by), and its
arrival is the request's one content instant (its TTFT is its latency)."""

from __future__ import annotations

from typing import Any

import orjson

from tailguard.gateway.upstream.client import RelayError, check_answer, stream_failure
from tailguard.gateway.upstream.h1 import H1Response, UpstreamBroke
from tailguard.gateway.upstream.tally import Tally
from tailguard.types import FailureKind
from tailguard.wire.framing import ANSWER_USAGE
from tailguard.wire.openai import Endpoint

# What a whole answer of these routes is, by one field of its object.
_SHAPES: dict[Endpoint, tuple[str, str]] = {"responses": ("object", "response"), "messages": ("type", "message")}


async def read_whole(up: H1Response, endpoint: Endpoint, tally: Tally) -> bytes:
    """The answer's bytes; its usage goes into `tally`. Raises `RelayError` when the backend
    sends more than the bound, breaks off, or answers what is not the route's JSON."""
    backend = tally.request.backend
    check_answer(up, backend, stream=False)
    tally.start_run(stream=False)
    out = bytearray()
    try:
        while data := await up.readany():
            tally.watchdog.last_at = tally.clock()
            tally.read(len(data))
            out += data
    except UpstreamBroke as e:
        raise stream_failure(e) from None
    finally:
        tally.end_run()
    tally.content(tally.clock())
    try:
        obj = orjson.loads(out)
    except orjson.JSONDecodeError:
        raise RelayError(FailureKind.PROTOCOL, f"Backend '{backend}' sent an answer that is not JSON.") from None
    if not _shaped(obj, endpoint):
        raise RelayError(FailureKind.PROTOCOL, f"Backend '{backend}' sent JSON that is not a {endpoint} answer.")
    ANSWER_USAGE[endpoint](tally.usage, obj)
    tally.counted()
    return bytes(out)


def _shaped(obj: Any, endpoint: Endpoint) -> bool:
    if not isinstance(obj, dict):
        return False
    shape = _SHAPES.get(endpoint)
    return shape is None or obj.get(shape[0]) == shape[1]
