"""An answer relayed whole: the routes that answer once (embeddings, rerank, score, tokenize,
detokenize) and a non-stream Responses or Messages call, forwarded as the client sent it. The body
is read within `limits.max_answer_bytes`, parsed once for its usage (what the request is
metered by), and its arrival is the request's one content instant (its TTFT is its latency)."""

from __future__ import annotations

import orjson

from tailguard.config import LimitsConfig
from tailguard.gateway.upstream.client import RelayError, stream_failure
from tailguard.gateway.upstream.h1 import H1Response, UpstreamBroke
from tailguard.gateway.upstream.tally import Tally
from tailguard.types import FailureKind
from tailguard.wire.framing import ANSWER_USAGE
from tailguard.wire.openai import Endpoint


async def read_whole(up: H1Response, endpoint: Endpoint, tally: Tally, limits: LimitsConfig) -> bytes:
    """The answer's bytes; its usage goes into `tally`. Raises `RelayError` when the backend
    sends more than the bound or breaks off."""
    tally.start_run()
    out = bytearray()
    try:
        while data := await up.readany():
            tally.watchdog.last_at = tally.clock()
            out += data
            if len(out) > limits.max_answer_bytes:
                raise RelayError(FailureKind.PROTOCOL, f"Backend sent over {limits.max_answer_bytes} bytes for one "
                                 "answer (limits.max_answer_bytes)")
    except UpstreamBroke as e:
        raise stream_failure(e) from None
    tally.content(tally.clock())
    try:
        ANSWER_USAGE[endpoint](tally.usage, orjson.loads(out))
    except orjson.JSONDecodeError:
        raise RelayError(FailureKind.PROTOCOL, "Backend sent an answer that is not JSON.") from None
    return bytes(out)
