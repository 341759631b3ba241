"""Each refusal the front decides has one wording (`gateway.rejection`), whichever part's verdict it
was: OpenAI's 429 for a caller's limits, a 503 with Retry-After for the gateway's, a 404 for a
model nobody serves, the reason in `X-Tailguard-Reject-Reason` always."""

from __future__ import annotations

import pytest

from tailguard.errors import NotFound, Overloaded, RateLimited
from tailguard.front.events import Reject
from tailguard.gateway.rejection import rejection
from tailguard.types import RejectReason as R


@pytest.mark.parametrize(("reject", "status", "words"), [
    (Reject("r", R.RATE_LIMIT_REQUESTS, 2.0, 60, 60), 429,
     "Rate limit reached for caller 'app' on requests per min (RPM): Limit 60, Used 60. Please try again in 2s."),
    (Reject("r", R.RATE_LIMIT_TOKENS, 0.5, 1000, 990, shared=True), 429,
     "Rate limit reached for caller 'app' on tokens per min (TPM) over all replicas: Limit 1000, Used 990. "
     "Please try again in 500ms."),
    (Reject("r", R.RATE_LIMIT_PARALLEL, 1.0, 2, 2), 429,
     "Rate limit reached for caller 'app' on requests at once (max_parallel_requests): Limit 2, Used 2."),
    (Reject("r", R.QUEUE_FULL, 1.0, 1 << 20, 1 << 20), 503, "The gateway's queue holds its budget of 1048576 bytes"),
    (Reject("r", R.QUEUE_FULL, 3.0), 503, "The gateway's queue for this class is full; retry later."),
    (Reject("r", R.QUEUE_TIMEOUT, 1.0), 503, "The request waited 5.250 s in the queue, past its class bound."),
    (Reject("r", R.WAIT_BOUND, 4.0), 503, "within its class's queue bound"),
    (Reject("r", R.NO_HEALTHY_BACKEND, 1.0), 503, "No healthy backend is available."),
    (Reject("r", R.SHUTTING_DOWN, 1.0), 503, "The gateway is shutting down."),
    (Reject("r", R.SHARED_STATE_UNAVAILABLE, 1.0), 503, "cannot reach its shared state (Redis)"),
    (Reject("r", R.MODEL_NOT_FOUND, 0.0), 404, "The model `nope` does not exist: no backend of this gateway serves "
     "it. Served here: a, b."),
], ids=lambda v: v.reason.value if isinstance(v, Reject) else None)
def test_each_refusal_has_one_wording(reject: Reject, status: int, words: str) -> None:
    err = rejection(reject, caller="app", model="nope", waited_s=5.25, served=["b", "a", "b"])
    assert err.status == status and words in err.message
    if status == 404:
        assert isinstance(err, NotFound) and err.code == "model_not_found"
        return
    assert err.headers["X-Tailguard-Reject-Reason"] == reject.reason.value
    assert err.retry_after_s == reject.retry_after_s
    assert isinstance(err, RateLimited if status == 429 else Overloaded)
