"""One request's chunk bookkeeping, kept the same way by every path that reads an upstream
stream (the client relay, the tracked relay of a preemptible request, the non-stream assembler,
a whole answer): first content, inter-chunk gaps, the content chunk count and the usage chunk,
each held to what the request asked (`gateway.upstream.bound`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tailguard.clock import Now
from tailguard.config.limits import LimitsConfig
from tailguard.gateway.ops.histograms import ChunkHistogram
from tailguard.gateway.request import Request
from tailguard.gateway.upstream.bound import AnswerBound
from tailguard.gateway.upstream.client import RelayError
from tailguard.gateway.upstream.watchdog import DeadlineWatch
from tailguard.types import FailureKind
from tailguard.wire.chunks import Usage, finish_reasons, response_id

MAX_CHOICES = 128  # finish reasons kept per request (OpenAI's `n` is at most 128)


@dataclass(slots=True)
class Tally:
    """Counts content chunks into `request` and `itl`, and ends the watchdog's first-token phase.

    It outlives a suspension: a resumed run's first chunk is not a first token for the request
    (its gap since the last chunk before the suspension is an ITL sample), but it is for the
    watchdog, whose first-token deadline applies again to each run (`start_run`).

    It holds the answer to its `bound` over every run: content past it fails the attempt (`cut`),
    and a count the engine reports past it is charged as the bound (the rest is the record's
    `overrun_tokens`, the backend's fault)."""

    request: Request  # the request's record: the chunk facts are written here only
    watchdog: DeadlineWatch
    itl: ChunkHistogram
    clock: Now  # the gateway's one clock: every path that reads the stream reads it here
    # A traced request's chunks are scanned for how its answer ended (`answer_end`); an untraced
    # one's never are, so telemetry off costs the relay one attribute read per chunk.
    traced: bool = False
    bound: AnswerBound = field(default_factory=AnswerBound)
    usage: Usage = field(default_factory=Usage)
    run_started: bool = False
    # Reads of this run that brought bytes but no content yet, and when the second came: a role
    # chunk and then silence is a long prefill; bytes that keep coming without content are not.
    empty_reads: int = 0
    empty_since: float = 0.0
    # Told the instant of the request's first content, when its front wants to know it (a TTFT
    # sample of an adaptive backend: `Front.wants_first_content`); once per request, off the
    # per-chunk path.
    on_first: Callable[[float], None] | None = None
    # The answer's bound as the C step reads it (once per run): the content events it may carry,
    # and the largest lone content event the step passes on without counting its bytes.
    max_events: int = field(init=False)
    event_bytes: int = field(init=False)
    cut: bool = False  # the answer passed its bound: its relay ends it as cut at its length
    # Bytes of the answer counted so far, over every run, and what they may come to (`read`):
    # set per run, a stream's bound or a non-stream answer's.
    body_bytes: int = 0
    max_body: int = field(init=False)
    stream: bool = True

    def __post_init__(self) -> None:
        b = self.bound
        self.max_events, self.event_bytes, self.max_body = b.events, b.event_bytes, b.stream_bytes

    def start_run(self, stream: bool = True) -> None:
        """A run begins: `stream`, read for a stream (else for a non-stream answer, held whole)."""
        self.run_started = False
        self.empty_reads = 0
        self.stream = stream
        self.max_body = self.bound.byte_limit(stream)

    def read(self, n: int) -> None:
        """`n` more bytes of the answer were read: past its bound, the attempt fails (the backend
        broke the protocol: an answer larger than its request allows)."""
        self.body_bytes += n
        if self.body_bytes > self.max_body:
            raise RelayError(FailureKind.PROTOCOL,
                             f"Backend '{self.request.backend}' sent {self.bound.why_bytes(self.stream)}")

    def end_run(self) -> None:
        """The run stopped reading (ended, failed or suspended): what its engine sent past the
        bound, without a count of its own, is charged as the bound."""
        t = self.request
        if self.usage.completion_tokens is None and t.content_chunks > self.bound.charged:
            self._overran(t.content_chunks)

    def counted(self) -> None:
        """The engine's usage was read: a count past what the request allows is charged as the
        most it allows (a backend that says it generated a million tokens for `max_tokens: 5`
        must not put its caller in debt)."""
        ct = self.usage.completion_tokens
        if ct is not None and ct > self.bound.charged:
            self._overran(ct)

    def room(self, n: int) -> None:
        """`n` more content events fit in the answer's bound, or the attempt fails (`_cut`)."""
        events = self.request.content_chunks + n
        if events > self.max_events:
            self._cut(events)

    def _overran(self, generated: int) -> None:
        charged = self.bound.charged
        self.request.overrun_tokens = max(self.request.overrun_tokens, generated - charged)
        self.usage.completion_tokens = charged

    def _cut(self, events: int) -> None:
        """Content past the bound: the attempt fails as the backend's protocol error; its caller
        is charged the most the request allows."""
        self.cut = True
        self._overran(events)
        raise RelayError(FailureKind.PROTOCOL, f"Backend '{self.request.backend}' sent "
                         f"{self.bound.why_tokens(events, 'content events')}; the answer was cut there")

    def no_content(self, now: float, limits: LimitsConfig) -> None:
        """A read before this run's first content brought none: past `limits.max_preamble_s` from
        the second such read, the attempt fails (shorter than the first-token deadline, which a
        long prefill needs)."""
        if self.run_started:
            return
        self.empty_reads += 1
        if self.empty_reads == 2:
            self.empty_since = now
        elif self.empty_reads > 2 and now - self.empty_since > limits.max_preamble_s:
            raise RelayError(FailureKind.PROTOCOL, f"Backend kept sending bytes without content for "
                             f"{now - self.empty_since:.1f} s, over limits.max_preamble_s ({limits.max_preamble_s:g})")

    def content(self, now: float, n: int = 1) -> None:
        """`n` content chunks arrived in one read at `now`: the first has the gap since the last
        content chunk, the others none. The usual chunk (one, past the run's first) costs one
        test before its gap is counted: the relay calls this per chunk. Past the answer's bound
        nothing of the read is counted, and the attempt fails (`_cut`)."""
        t = self.request
        if t.content_chunks + n > self.max_events:
            self._cut(t.content_chunks + n)
        t.content_chunks += n
        last, t.last_content_at = t.last_content_at, now
        if not self.run_started:
            self.run_started = True
            self.watchdog.first_content(now)
        if last is None:
            t.first_content_at = now
            if self.on_first is not None:
                self.on_first(now)
        else:
            self.itl.observe(now - last)
        if n > 1:
            self.itl.observe_zeros(n - 1)

    def answer_end(self, data: bytes, start: int, end: int) -> None:
        """A traced request's event(s) in data[start:end]: the response id (from the first event
        that has one) and each choice's finish reason, onto the record."""
        t = self.request
        if t.response_id is None:
            t.response_id = response_id(data, start, end)
        if len(t.finish_reasons) < MAX_CHOICES:
            reasons = finish_reasons(data, start, end)
            if reasons:
                t.finish_reasons = (t.finish_reasons + tuple(reasons))[:MAX_CHOICES]
