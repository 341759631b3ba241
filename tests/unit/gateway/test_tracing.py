"""A request's spans from its record's changes, with the SDK's in-memory exporter and literal
instants on the gateway's clock: the queue, a failed attempt, its retry, a suspension and the
continuation, each under the root, and the root's GenAI attributes."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tailguard.clock import monotonic
from tailguard.gateway.ops.tracing import Tracer
from tailguard.gateway.request import Ended, Request
from tailguard.types import Outcome
from tailguard.wire.openai import validate_body


def test_spans_follow_the_record() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer(provider, monotonic)
    t = Request("tg-1", 100.0, "chat", "req-1", model="llama", cls="batch")
    trace = tracer.begin(t, {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    trace.started("a", False, 100.5)  # out of the queue (the dispatcher tells it each Start)
    assert (trace.traceparent() or "").startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    trace.failed("connect", 100.6)
    trace.started("b", False, 100.6)  # the retry
    trace.suspended(101.0)
    trace.started("b", True, 102.0)  # the continuation
    t.upstream_headers_at, t.prompt_tokens, t.output_tokens, t.finished_at = 100.7, 12, 30, 103.0
    t.response_id, t.finish_reasons = "chatcmpl-9", ("stop",)
    t.end(Outcome.SUCCESS, 200, None)
    tracer.end(Ended(t, "POST", "/v1/chat/completions", trace), "vllm", None)
    spans = {s.name + ("+" if s.attributes and s.attributes.get("tailguard.resumed") else ""): s
             for s in exporter.get_finished_spans()}
    root = spans["chat llama"]
    assert root.parent is not None and f"{root.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert [(n, (s.end_time - s.start_time) / 1e9) for n, s in sorted(spans.items(), key=lambda kv: kv[1].start_time)
            if s is not root] == [("queue", 0.5), ("upstream a", 0.1), ("upstream b", 0.4), ("suspended", 1.0),
                                  ("upstream b+", 1.0)]
    assert spans["upstream a"].attributes["error.type"] == "connect"
    assert spans["upstream b"].attributes["tailguard.retry_reason"] == "connect"
    assert spans["upstream b"].attributes["tailguard.suspended"] is True
    a = root.attributes
    assert (a["gen_ai.request.model"], a["gen_ai.provider.name"], a["gen_ai.usage.input_tokens"],
            a["gen_ai.usage.output_tokens"], a["tailguard.class"]) == ("llama", "vllm", 12, 30, "batch")
    assert (a["gen_ai.operation.name"], a["gen_ai.response.model"], a["gen_ai.response.id"],
            a["gen_ai.response.finish_reasons"]) == ("chat", "llama", "chatcmpl-9", ("stop",))
    assert (root.end_time - root.start_time) / 1e9 == 3.0


def test_the_request_attributes_and_a_provider_not_yet_known() -> None:
    """The gen_ai.request.* attributes come from the validated body; a request that never reached a
    backend still names a provider (the conventions require one) and has no finish reason."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer(provider, monotonic)
    body = {"model": "m", "prompt": "hi", "max_tokens": 7, "n": 2, "temperature": 0.5, "seed": 3, "stream": True}
    t = Request("tg-2", 10.0, "completions", "req-2", model="m")
    trace = tracer.begin(t, {}, validate_body(body, "completions"))
    t.finished_at = 10.5
    t.end(Outcome.REJECTED, 503, "queue_full")
    tracer.end(Ended(t, "POST", "/v1/completions", trace), None, None)
    (root,) = [s for s in exporter.get_finished_spans() if s.parent is None]
    a = dict(root.attributes or {})
    assert root.name == "text_completion m"
    assert {k: a[k] for k in a if k.startswith("gen_ai.request.")} == {
        "gen_ai.request.stream": True, "gen_ai.request.max_tokens": 7, "gen_ai.request.choice.count": 2,
        "gen_ai.request.temperature": 0.5, "gen_ai.request.seed": 3, "gen_ai.request.model": "m"}
    assert a["gen_ai.provider.name"] == "unknown" and a["error.type"] == "queue_full"
    assert "gen_ai.response.finish_reasons" not in a and "gen_ai.response.id" not in a
