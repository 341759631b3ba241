"""The one wording of each refusal the front decides (`front.events.Reject`), as the error the
client gets: OpenAI's 429 for a caller's own limits (which its SDK retries after the wait), a 503
with `Retry-After` for the gateway's, a 404 for a model nobody serves. Every refusal reaches the
client through here, whichever replica's or part's verdict it was; `X-Tailguard-Reject-Reason`
and `tailguard_rejected_total{reason}` say the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from tailguard.errors import APIError, NotFound, Overloaded, RateLimited
from tailguard.front.events import Reject
from tailguard.types import RejectReason
from tailguard.wire.openai import duration_text

_TEXT = {
    RejectReason.WAIT_BOUND: "The gateway would not start this request within its class's queue bound; retry later.",
    RejectReason.DEADLINE: ("The gateway predicts this request would not get its first token within its TTFT target "
                            "(its class's `slo.ttft_s`, or its own `x-tailguard-ttft-slo-ms`); retry later."),
    RejectReason.SHED: ("The gateway shed this queued request to serve cheaper ones within their TTFT targets "
                        "(it would cost the most per target met); retry later."),
    RejectReason.NO_HEALTHY_BACKEND: "No healthy backend is available.",
    RejectReason.SHUTTING_DOWN: "The gateway is shutting down.",
    RejectReason.SHARED_STATE_UNAVAILABLE: ("The gateway cannot reach its shared state (Redis) to check this caller's "
                                            "limits; retry later."),
}
# A caller's own limits: what OpenAI's 429 calls the limit, and its `type`.
_LIMITS = {
    RejectReason.RATE_LIMIT_REQUESTS: ("requests per min (RPM)", "requests"),
    RejectReason.RATE_LIMIT_TOKENS: ("tokens per min (TPM)", "tokens"),
    RejectReason.RATE_LIMIT_PARALLEL: ("requests at once (max_parallel_requests)", "requests"),
}


def rejection(d: Reject, *, caller: str | None = None, model: str | None = None, waited_s: float = 0.0,
              served: Iterable[str] = ()) -> APIError:
    """The error for `d`: `caller` names whose limit it was; `model` and `served` word a model
    nobody serves; `waited_s` how long a request that expired in the queue waited."""
    reason = d.reason
    if reason is RejectReason.MODEL_NOT_FOUND:
        names = sorted(set(served))
        listing = f" Served here: {', '.join(names)}." if names else ""
        return NotFound(f"The model `{model}` does not exist: no backend of this gateway serves it.{listing}",
                        param="model", code="model_not_found")
    headers = {"X-Tailguard-Reject-Reason": reason.value}
    limit = _LIMITS.get(reason)
    if limit is not None:
        what, kind = limit
        over = " over all replicas" if d.shared else ""
        use = f": Limit {d.limit}, Used {d.used}" if d.limit is not None and d.used is not None else ""
        text = (f"Rate limit reached for caller '{caller}' on {what}{over}{use}. Please try again in "
                f"{duration_text(d.retry_after_s)}.")
        return RateLimited(text, type=kind, code="rate_limit_exceeded", retry_after_s=d.retry_after_s, headers=headers)
    if reason is RejectReason.QUEUE_FULL:
        text = (f"The gateway's queue holds its budget of {d.limit} bytes of request bodies; retry later."
                if d.limit is not None else "The gateway's queue for this class is full; retry later.")
    elif reason is RejectReason.QUEUE_TIMEOUT:
        text = f"The request waited {waited_s:.3f} s in the queue, past its class bound."
    elif reason is RejectReason.LATE:
        text = (f"The request waited {waited_s:.3f} s in the queue and can no longer get its first token within its "
                "TTFT target (its class's `slo.ttft_s`, or its own `x-tailguard-ttft-slo-ms`); retry later.")
    else:
        text = _TEXT[reason]
    return Overloaded(text, code=reason, retry_after_s=d.retry_after_s, headers=headers)
