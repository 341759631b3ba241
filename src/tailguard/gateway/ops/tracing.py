"""OpenTelemetry traces of requests, in the GenAI semantic conventions' names (optional: the `otel`
extra; off, nothing here is imported and a request carries no trace).

One trace per request, its spans opened and closed as the record changes, on the gateway's one
clock (converted to wall time once, at start):

    chat {model}                 SERVER  arrival to the last byte: gen_ai.* and tailguard.* attributes
    ├── queue                            arrival to the first start
    ├── upstream {backend}       CLIENT  one per attempt or continuation; error.type when it failed,
    │                                    tailguard.retry_reason on the attempt that retried it
    ├── suspended                        a preemption: from the suspension to its continuation
    └── upstream {backend} ...

An incoming `traceparent` is the root's parent; each attempt's own context goes upstream as its
`traceparent`, so the engine's spans join the trace.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tailguard import __version__
from tailguard.clock import Now
from tailguard.errors import ConfigError
from tailguard.config import GatewayConfig
from tailguard.gateway.ops.metrics import GENAI_OPERATION, UNKNOWN_PROVIDER
from tailguard.gateway.request import Ended, Request
from tailguard.types import Outcome

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

    from tailguard.wire.openai import ParsedRequest

# The request's sampling fields, as the conventions name them (gen-ai-spans.md, inference).
_SAMPLING = {"temperature": "gen_ai.request.temperature", "top_p": "gen_ai.request.top_p",
             "presence_penalty": "gen_ai.request.presence_penalty",
             "frequency_penalty": "gen_ai.request.frequency_penalty", "seed": "gen_ai.request.seed"}


def request_attributes(parsed: ParsedRequest) -> dict[str, Any]:
    """The root span's gen_ai.request.* attributes from a validated body: streaming, the output
    limit, the choice count where it is not 1, and the sampling fields the client set."""
    attrs: dict[str, Any] = {"gen_ai.request.stream": parsed.stream}
    if parsed.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = parsed.max_tokens
    if parsed.n != 1:
        attrs["gen_ai.request.choice.count"] = parsed.n
    body = parsed.body
    for field, key in _SAMPLING.items():
        v = body.get(field)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            attrs[key] = v
    return attrs


def endpoint_of(cfg: GatewayConfig, env: Mapping[str, str] = os.environ) -> str | None:
    """Where traces go: the config's endpoint, else OpenTelemetry's standard variables."""
    if cfg.telemetry.otlp_endpoint:
        return cfg.telemetry.otlp_endpoint
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/traces" if base else None


class Tracer:
    """Starts a request's trace (`begin`) and ends it (`end`); `shutdown` flushes the exporter."""

    def __init__(self, provider: TracerProvider, clock: Now) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.clock = clock
        self._tracer = provider.get_tracer("tailguard", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._offset_ns = time.time_ns() - int(clock() * 1e9)  # the one clock, as wall time

    @classmethod
    def of(cls, cfg: GatewayConfig, clock: Now) -> Tracer | None:
        """The tracer `cfg` asks for, exporting OTLP over HTTP; None when telemetry is off."""
        endpoint = endpoint_of(cfg)
        if endpoint is None:
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise ConfigError("telemetry.otlp_endpoint needs OpenTelemetry: pip install 'tailguard[full,otel]'") \
                from None
        provider = TracerProvider(resource=Resource.create({"service.name": cfg.telemetry.service_name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        return cls(provider, clock)

    def ns(self, at: float) -> int:
        return int(at * 1e9) + self._offset_ns

    def begin(self, t: Request, headers: Mapping[str, str], parsed: ParsedRequest | None = None) -> RequestTrace:
        """The request's trace, from its arrival, child of the caller's `traceparent` if any."""
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract(headers)
        root = self._tracer.start_span(GENAI_OPERATION[t.endpoint], context=parent, kind=SpanKind.SERVER,
                                       start_time=self.ns(t.arrived_at),
                                       attributes=None if parsed is None else request_attributes(parsed))
        return RequestTrace(self, root, t.arrived_at)

    def end(self, e: Ended, provider: str | None, response_model: str | None) -> None:
        """Its last span ends as the request does: attributes from its record."""
        if isinstance(e.trace, RequestTrace):
            e.trace.end(e.request, provider, response_model)

    def child(self, name: str, root: Span, at: float, attributes: dict[str, Any], client: bool = False) -> Span:
        from opentelemetry.trace import SpanKind, set_span_in_context

        return self._tracer.start_span(name, context=set_span_in_context(root), start_time=self.ns(at),
                                       kind=SpanKind.CLIENT if client else SpanKind.INTERNAL, attributes=attributes)

    def shutdown(self) -> None:
        self.provider.shutdown()


class RequestTrace:
    """One request's open spans (`gateway.request.TraceHook`)."""

    __slots__ = ("_tracer", "_root", "_queue", "_attempt", "_suspension", "_retry_reason")

    def __init__(self, tracer: Tracer, root: Span, arrived_at: float) -> None:
        self._tracer = tracer
        self._root = root
        self._queue: Span | None = tracer.child("queue", root, arrived_at, {})
        self._attempt: Span | None = None
        self._suspension: Span | None = None
        self._retry_reason: str | None = None

    def started(self, backend: str, resumed: bool, now: float) -> None:
        self._close("_queue", now)
        self._close("_suspension", now)
        self._close("_attempt", now)
        attrs: dict[str, Any] = {"tailguard.backend": backend, "tailguard.resumed": resumed}
        if self._retry_reason is not None:
            attrs["tailguard.retry_reason"] = self._retry_reason
            self._retry_reason = None
        self._attempt = self._tracer.child(f"upstream {backend}", self._root, now, attrs, client=True)

    def suspended(self, now: float) -> None:
        if self._attempt is not None:
            self._attempt.set_attribute("tailguard.suspended", True)
        self._close("_attempt", now)
        self._suspension = self._tracer.child("suspended", self._root, now, {})

    def failed(self, kind: str, now: float) -> None:
        from opentelemetry.trace import Status, StatusCode

        if self._attempt is not None:
            self._attempt.set_attribute("error.type", kind)
            self._attempt.set_status(Status(StatusCode.ERROR, kind))
        self._close("_attempt", now)
        self._retry_reason = kind  # the next start, if the front sends it again, retries this

    def traceparent(self) -> str | None:
        if self._attempt is None:
            return None
        ctx = self._attempt.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"

    def end(self, t: Request, provider: str | None, response_model: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        end = t.finished_at if t.finished_at is not None else self._tracer.clock()
        for slot in ("_queue", "_suspension", "_attempt"):
            self._close(slot, end)
        root = self._root
        op = GENAI_OPERATION[t.endpoint]
        if t.model:
            root.update_name(f"{op} {t.model}")
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op, "gen_ai.provider.name": provider or UNKNOWN_PROVIDER,
            "tailguard.class": t.cls, "tailguard.outcome": t.outcome.value,
            "tailguard.attempts": t.counts.attempts, "tailguard.preemptions": t.counts.preemptions,
            "http.response.status_code": t.status, "gen_ai.usage.output_tokens": t.output_tokens,
        }
        optional = {"gen_ai.request.model": t.model, "gen_ai.response.model": response_model or t.model,
                    "gen_ai.response.id": t.response_id, "tailguard.caller": t.caller,
                    "tailguard.reason": t.reason}
        attrs.update({k: v for k, v in optional.items() if v is not None})
        if t.answered:
            attrs["gen_ai.usage.input_tokens"] = t.prompt_tokens
        if t.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = t.finish_reasons
        root.set_attributes(attrs)
        if t.outcome is not Outcome.SUCCESS:
            root.set_attribute("error.type", t.reason or t.outcome.value)
            root.set_status(Status(StatusCode.ERROR, t.reason or t.outcome.value))
        root.end(end_time=self._tracer.ns(end))

    def _close(self, slot: str, at: float) -> None:
        span = getattr(self, slot)
        if span is not None:
            span.end(end_time=self._tracer.ns(at))
            setattr(self, slot, None)
