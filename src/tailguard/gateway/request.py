"""One request's record in the gateway: the facts it knows of it, each kept once, on the gateway's
one clock (the one it was built with and passes in: `tailguard.clock.Now`). Facts only: what the
driver holds of a request while it runs (the future its exchange waits on, how a suspension stops
its attempt, its text so far, its deadlines, its spans) is its `Line` (`gateway.line`).

The record is made when the request arrives and lives until its one end (`gateway.lifecycle`),
where it is handed, complete, to every listener as `Ended`. Who writes what:

    the lifecycle      class, caller, model, program, prompt estimate, the caller's rate headers,
                       how it ended (`end`, `refused`)
    the dispatcher     backend and bound_at from each `Start`, and its counts (attempts, retries,
                       migrations, preemptions, hedges: `front.counts`) from every decision about
                       it, as it carries them out: never worked out again
    the exchange       upstream_headers_at, output tokens, when its answer ended; its `Tally` the
                       chunk facts (first/last content, content chunks), the hot path's only writes

Metrics, `Server-Timing`, the access log, the meter, a recording and a trace read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailguard.errors import APIError, Overloaded
from tailguard.front.counts import Counts
from tailguard.front.identity import Program
from tailguard.front.intake import NO_CLASS
from tailguard.front.params import Slo
from tailguard.types import Outcome
from tailguard.wire.openai import Endpoint


@dataclass(slots=True)
class Request:
    """What the gateway knows of one request (see the module docstring for who writes what)."""

    id: str
    arrived_at: float
    endpoint: Endpoint = "chat"  # the route it came in by (gen_ai.operation.name)
    request_id: str = ""  # x-request-id: the client's own (sanitized), else `id`; sent upstream
    client: str | None = None  # the peer's address
    user_agent: str | None = None
    cls: str = NO_CLASS
    caller: str | None = None  # its API key's name, when keys are configured
    key: str | None = None  # its API key's fingerprint, kept only for the audit trail
    model: str | None = None  # the model it names (an alias resolved)
    program: Program | None = None  # the agent program it is a call of, and which call (`front.identity`)
    slo: Slo | None = None  # its targets: its class's, its TTFT tightened by the intake (None: none)
    rate_headers: dict[str, str] | None = None  # where the caller's limits stand (x-ratelimit-*)
    # From the front's decisions.
    backend: str = "-"
    counts: Counts = field(default_factory=Counts)
    bound_at: float | None = None  # its first Start
    # Upstream and chunks.
    upstream_headers_at: float | None = None
    first_content_at: float | None = None
    last_content_at: float | None = None
    finished_at: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    output_estimated: bool = False  # counted from content chunks: the engine never said
    overrun_tokens: int = 0  # what its backend sent or counted past what it asked, not charged (`Tally`)
    content_chunks: int = 0
    # What the answer said of its end, read only for a traced request (its span's
    # gen_ai.response.finish_reasons and gen_ai.response.id; `Tally.answer_end`).
    finish_reasons: tuple[str, ...] = ()
    response_id: str | None = None
    # How it ended: if nothing else is recorded, its task was cancelled (the client left).
    outcome: Outcome = Outcome.CLIENT_GONE
    status: int = 499
    reason: str | None = None
    prompt_text: str | None = None  # kept only with `log_prompts` or `audit.retain_text`
    completion: str | None = None
    verdicts: list[str] | None = None  # its guards' verdicts but `pass` ("pii:redact"), when guards are on

    def started(self, backend: str, now: float) -> None:
        """A `Start` that is not a hedge's (the hedge races beside the request's own attempt)."""
        self.backend = backend
        if self.bound_at is None:
            self.bound_at = now

    def end(self, outcome: Outcome, status: int, reason: str | None, completion: str | None = None) -> None:
        self.outcome, self.status, self.reason, self.completion = outcome, status, reason, completion

    def refused(self, err: APIError) -> None:
        outcome = Outcome.REJECTED if isinstance(err, Overloaded) else Outcome.CLIENT_ERROR
        # The front's word when it refused (a 429's code is OpenAI's `rate_limit_exceeded`), so
        # the access log, the header and tailguard_rejected_total{reason} say the same.
        self.end(outcome, err.status, err.headers.get("X-Tailguard-Reject-Reason", err.code))

    def finish(self, now: float) -> None:
        """Its last instant, once: when its answer ended (the exchange), else when it ended."""
        if self.finished_at is None:
            self.finished_at = now

    @property
    def queue_s(self) -> float | None:
        return None if self.bound_at is None else self.bound_at - self.arrived_at

    @property
    def ttft_s(self) -> float | None:
        """From its arrival to its first content; None before any came."""
        return None if self.first_content_at is None else self.first_content_at - self.arrived_at

    @property
    def answered(self) -> bool:
        """An engine took the request (sent its response head): from then on its tokens count."""
        return self.upstream_headers_at is not None

    def used_tokens(self) -> int:
        """What the request cost: its prompt and generated tokens once an engine answered it,
        else nothing (refused, left while queued, or no engine ever answered). What its caller
        is charged, and what the token counters count."""
        return self.prompt_tokens + self.output_tokens if self.answered else 0


@dataclass(frozen=True, slots=True)
class Ended:
    """A request's one end, handed to every listener once (`gateway.lifecycle`): its record,
    complete, the HTTP line it came by, and its trace (None without telemetry)."""

    request: Request
    method: str
    path: str
    trace: object | None = None
