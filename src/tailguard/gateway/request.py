"""One request's record in the gateway: every fact the gateway knows of it, each kept once, on
the one clock (`tailguard.clock.monotonic`).

The record is made when the request arrives and lives until its one end. Who writes what:

    the proxy          class, caller, prompt estimate, the caller's rate headers, how it ended
    the dispatcher     backend, bound_at, and its counts (attempts, retries, migrations,
                       preemptions, hedges: `front.counts`) from the front's decisions as it
                       applies them, never worked out again
    the exchange       upstream_headers_at, output tokens; its `Tally` the chunk facts
                       (first/last content, content chunks), the hot path's only writes
    the end            finished_at (the exchange, else the proxy)

Metrics, `Server-Timing`, the access log and a recording read it (`gateway.ops.metrics`); the
driver's own handle of the request (the future its handler waits on, the hook that stops its
upstream when it is suspended, its deadlines) lives here too, so one request is one object.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.clock import monotonic
from tailguard.errors import APIError, Overloaded
from tailguard.front.counts import Counts
from tailguard.front.events import Start, StartMode
from tailguard.front.identity import Program
from tailguard.front.intake import NO_CLASS
from tailguard.gateway.upstream.resume import Transcript
from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tailguard.types import Outcome
from tailguard.wire.openai import Endpoint


class TraceHook(Protocol):
    """What a request's trace is told as its record changes (`gateway.ops.tracing` implements it;
    a request without a trace has None, and nothing is called)."""

    def started(self, backend: str, resumed: bool, now: float) -> None: ...
    def suspended(self, now: float) -> None: ...
    def failed(self, kind: str, now: float) -> None: ...
    def traceparent(self) -> str | None: ...  # the W3C header for the attempt running now


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
    model: str | None = None  # the model it names (an alias resolved)
    program: Program | None = None  # the agent program it is a call of, and which call (`front.identity`)
    rate_headers: dict[str, str] | None = None  # where the caller's limits stand (x-ratelimit-*)
    # From the front's decisions.
    backend: str = "-"
    counts: Counts = field(default_factory=Counts)
    hedged: str | None = None  # the backend of its second attempt, once the front hedged it
    bound_at: float | None = None  # its first Start
    # Upstream and chunks.
    upstream_headers_at: float | None = None
    first_content_at: float | None = None
    last_content_at: float | None = None
    finished_at: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    output_estimated: bool = False  # counted from content chunks: the engine never said
    content_chunks: int = 0
    # What the answer said of its end, read only for a traced request (its span's
    # gen_ai.response.finish_reasons and gen_ai.response.id; `Tally.answer_end`).
    finish_reasons: tuple[str, ...] = ()
    response_id: str | None = None
    # How it ended: if nothing else is recorded, its task was cancelled (the client left).
    outcome: Outcome = Outcome.CLIENT_GONE
    status: int = 499
    reason: str | None = None
    prompt_text: str | None = None  # kept only with `log_prompts`
    completion: str | None = None
    # The driver's handle, from admission to its end.
    waiter: asyncio.Future[Start] | None = None
    hedge_waiter: asyncio.Future[str] | None = None  # set by its exchange while a hedge may come
    progress: Transcript | None = None  # its text is tracked: it may be suspended
    on_suspend: Callable[[], None] | None = None  # set by its relay while an upstream is open
    ended: bool = False  # it left the front (finished, or rejected by the front itself)
    watchdog: DeadlineWatch | None = None  # its deadlines; `last_at` is when its backend last sent bytes
    trace: TraceHook | None = None  # its OpenTelemetry spans, when telemetry is on

    # --- written by the dispatcher, from the front's decisions --------------------------------

    def started(self, backend: str, mode: StartMode, now: float) -> None:
        """A `Start` (not a hedge's: that one races beside the request's own attempt)."""
        self.backend = backend
        if self.bound_at is None:
            self.bound_at = now
        if self.trace is not None:
            self.trace.started(backend, mode.continues, now)

    def suspended(self) -> None:
        """A `Suspend`: its upstream is closed, and it waits in the queue again."""
        hook, self.on_suspend = self.on_suspend, None
        if hook is not None:
            hook()
        if self.trace is not None:
            self.trace.suspended(monotonic())

    def attempt_failed(self, kind: str) -> None:
        """An upstream attempt failed (before the front says whether it goes again)."""
        if self.trace is not None:
            self.trace.failed(kind, monotonic())

    # --- its upstream, as the exchange opens and closes it ----------------------------------

    def upstream_opened(self, close: Callable[[], None]) -> None:
        """An upstream is open: `close` is how a suspension stops it."""
        self.on_suspend = close

    def upstream_closed(self) -> None:
        """The upstream is closed (or failed): a suspension has nothing to stop."""
        self.on_suspend = None

    # --- how it ended ---------------------------------------------------------------------

    def end(self, outcome: Outcome, status: int, reason: str | None, completion: str | None = None) -> None:
        self.outcome, self.status, self.reason, self.completion = outcome, status, reason, completion

    def refused(self, err: APIError) -> None:
        outcome = Outcome.REJECTED if isinstance(err, Overloaded) else Outcome.CLIENT_ERROR
        # The front's word when it refused (a 429's code is OpenAI's `rate_limit_exceeded`), so
        # the access log, the header and tailguard_rejected_total{reason} say the same.
        self.end(outcome, err.status, err.headers.get("X-Tailguard-Reject-Reason", err.code))

    def finish(self) -> None:
        """Its last instant, once (the exchange sets it when the answer ends, else the proxy)."""
        if self.finished_at is None:
            self.finished_at = monotonic()

    # --- read ------------------------------------------------------------------------------

    @property
    def queue_s(self) -> float | None:
        return None if self.bound_at is None else self.bound_at - self.arrived_at

    @property
    def answered(self) -> bool:
        """An engine took the request (sent its response head): from then on its tokens count."""
        return self.upstream_headers_at is not None

    def used_tokens(self) -> int:
        """What the request cost: its prompt and generated tokens once an engine answered it,
        else nothing (refused, left while queued, or no engine ever answered). What its caller
        is charged, and what the token counters count."""
        return self.prompt_tokens + self.output_tokens if self.answered else 0
