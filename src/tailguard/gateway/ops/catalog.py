"""Every metric the gateway exports, defined once (name, type, labels, help, buckets); pure, no I/O.

The gateway registers its collectors from this table (`gateway.ops.metrics`), the Grafana
dashboard and the Prometheus alert rules are generated against it (`gateway.ops.dashboard`,
`gateway.ops.alerts`), and docs/metrics.md lists it, so none of them can drift from the code:
a test fails when a metric has no panel or a panel names a metric that is not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]

# Seconds. Latency buckets span a loopback relay (ms) to a long generation (minutes).
# 2.0: the default interactive TTFT target (`classes[].slo.ttft_s`) is a bound, so a burn-rate rule can read it.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5, 5.0)
# The OpenTelemetry GenAI semantic conventions' explicit bucket boundaries (gen-ai-metrics.md), so
# these histograms aggregate with Envoy AI Gateway's and any other conforming emitter's.
# Seconds of one guard check: the built-in patterns' tens of microseconds to a classifier's seconds.
GUARD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
GENAI_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
GENAI_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
GENAI_TOKEN_BUCKETS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
                       4194304.0, 16777216.0, 67108864.0)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family. `name` is what prometheus_client is given: a counter is exposed with
    `_total`, a histogram as `_bucket`, `_sum` and `_count` (`series`)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def exposed(self) -> str:
        """The name a PromQL expression uses for the family."""
        return self.name + "_total" if self.kind == "counter" else self.name

    @property
    def series(self) -> tuple[str, ...]:
        """Every sample name the family exposes."""
        if self.kind == "histogram":
            return tuple(self.name + s for s in ("_bucket", "_sum", "_count"))
        return (self.exposed,)


def _c(name: str, help: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, "counter", help, labels)


def _g(name: str, help: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, "gauge", help, labels)


def _h(name: str, help: str, buckets: tuple[float, ...], *labels: str) -> MetricSpec:
    return MetricSpec(name, "histogram", help, labels, buckets)


METRICS: tuple[MetricSpec, ...] = (
    # Per class: load and latency.
    _g("tailguard_queue_length", "Requests waiting in the gateway queue.", "class"),
    _h("tailguard_queue_wait_seconds", "Time from arrival to being bound to a backend.", LATENCY_BUCKETS, "class"),
    _h("tailguard_ttft_seconds", "Arrival to the first chunk carrying generated content.", LATENCY_BUCKETS, "class"),
    _h("tailguard_itl_seconds", "Gaps between content chunks, per chunk.", ITL_BUCKETS, "class"),
    _h("tailguard_e2e_seconds", "Arrival to the last byte sent to the client.", LATENCY_BUCKETS, "class"),
    _c("tailguard_prompt_tokens", "Prompt tokens (from upstream usage, else the estimate).", "class"),
    _c("tailguard_output_tokens", "Generated tokens (from upstream usage, else content chunks).", "class"),
    _c("tailguard_requests", "Requests by terminal outcome; each request is counted once.", "class", "outcome"),
    _c("tailguard_slo", "Requests of a class with a service-level objective (`classes[].slo`), judged once as they "
       "end against each target it has (`ttft`, `tpot`, `e2e`; a request's own tighter TTFT target where it asked "
       "for one): `met` or `missed` (refused and failed requests miss; client errors are not judged).",
       "class", "slo", "result"),
    _c("tailguard_unclassified_requests", "Requests refused before they had a class (bad key, unreadable or "
       "invalid body, unknown class), by HTTP status; counted once, not in tailguard_requests_total.", "status"),
    _c("tailguard_rejected", "Requests refused by admission or expired in the queue, by reason (the "
       "X-Tailguard-Reject-Reason header and the access log's `reason` say the same word).", "class", "reason"),
    _c("tailguard_preemptions", "Running requests suspended to free a slot for higher-priority work (each is "
       "resumed later where it stopped).", "class"),
    _c("tailguard_migrations", "Streams continued on another backend after theirs died or stalled mid-answer, by "
       "the failure that moved them (reset, disconnect, timeout_idle); a client's own cancel is never one.",
       "class", "reason"),
    _c("tailguard_hedges", "Hedged requests' second attempts: `sent`, then `won` (its content came first), `lost` "
       "(the first attempt's did) or `failed`.", "class", "outcome"),
    _g("tailguard_class_queue_bound_seconds", "Each class's longest queue wait (`max_queue_wait_s`): queue wait "
       "over it is a refusal, so wait / bound is how close the class is to shedding.", "class"),
    _g("tailguard_class_queue_limit", "Each class's longest queue (`max_queue_len`).", "class"),
    # Per backend.
    _g("tailguard_inflight", "Requests bound to a backend and not yet finished.", "backend"),
    # One cap gauge: the cap in force is the one that binds (a fixed `max_concurrency` is in force as it
    # is), so inflight / it is the saturation; the configured ceiling of an adaptive cap is in the config.
    _g("tailguard_backend_concurrency_limit", "The in-flight cap in force on a backend: its `max_concurrency`, or "
       "where it is `adaptive`, the cap its latency has set; inflight / this is its saturation.", "backend"),
    _g("tailguard_backend_healthy", "1 if a backend takes requests: its health probes succeed and it is not "
       "ejected.", "backend"),
    _c("tailguard_backend_health_changes", "Changes of a backend's health, each once: `unhealthy` and `healthy` "
       "(active probes), `ejected` and `readmitted` (passive).", "backend", "to"),
    _c("tailguard_backend_ejections", "Backends taken out for a while after failing requests in a row (passive "
       "health), by the kind of the last failure.", "backend", "kind"),
    _g("tailguard_backend_stale", "1 while a backend's probes (or engine metrics) have answered once and not since "
       "within `routing.stale_after_s`: routing counts it as saturated (a request goes there only when no other "
       "backend may take it).", "backend"),
    _g("tailguard_backend_engine_requests", "Requests the engine itself reports running and waiting (its own "
       "load page, read with each health probe); waiting above 0 means the gateway's cap is above the engine's "
       "slots.", "backend", "state"),
    _g("tailguard_backend_kind", "1 for the kind each backend is treated as (named in the config, or detected "
       "when `auto`).", "backend", "kind"),
    _c("tailguard_upstream_errors", "Failed upstream attempts by kind (connect, status, timeout, ...).",
       "backend", "kind"),
    _c("tailguard_upstream_overrun_tokens", "Tokens a backend generated (or counted) past what requests asked "
       "(`n x max_tokens`), not charged to their callers: the backend's fault.", "backend"),
    _c("tailguard_retries", "Failed attempts the gateway sent again, by the backend that failed and how.",
       "backend", "kind"),
    _c("tailguard_retries_denied", "Failed attempts of a kind that may be retried which were not: the attempts "
       "limit, no other backend to try, or the retry budget spent.", "backend", "kind"),
    # The autoscaler's signal (`front.capacity`).
    _g("tailguard_capacity_needed", "Backends each pool needs to keep every class it serves inside its queue "
       "bound: the requests that ended there per second plus the backlog drained within the tightest bound, "
       "times their service time, over one backend's slots.", "pool"),
    _g("tailguard_capacity_ready", "Backends of each pool healthy, not ejected, taking requests now.", "pool"),
    _c("tailguard_connections_closed", "Client connections the gateway closed on its own: header_timeout (no "
       "whole request head in time), evicted_idle (an idle one closed at the cap for a new one), over_cap "
       "(refused: every connection busy and the reserve taken).", "reason"),
    # Callers, only when keys are configured: a bounded label.
    _c("tailguard_caller_requests", "Requests by caller and terminal outcome.", "caller", "outcome"),
    _c("tailguard_caller_tokens", "Tokens by caller: prompt and output (from upstream usage, else the estimate "
       "and content chunks).", "caller", "kind"),
    # Guards and the audit trail (docs/security.md).
    _c("tailguard_guard_checks", "Guard checks by verdict: pass, block, redact, flag (its action on a finding), or "
       "error_open and error_closed (the check failed or passed its timeout_s, and its on_error).",
       "guard", "stage", "verdict"),
    _h("tailguard_guard_seconds", "Time of one guard check, bounded by its timeout_s: the built-in patterns on the "
       "loop, a long text's on a thread, or a moderation service's round trip.", GUARD_BUCKETS, "guard", "stage"),
    _c("tailguard_audit_entries", "Audit entries written to the store."),
    _c("tailguard_audit_dropped", "Audit entries dropped because the queue was full (`audit.when_full: drop`; the "
       "trail records a gap entry for each run of them)."),
    _c("tailguard_audit_write_failures", "Batches of audit entries the store refused (each is tried again)."),
    _g("tailguard_audit_queue_length", "Audit entries waiting to be written (at `audit.queue_entries` the queue is "
       "full)."),
    # Agent programs (docs/agents.md): how calls were known as one program's; bounded labels.
    _c("tailguard_program_calls", "Calls that were part of an agent program, by class and what named the program "
       "(a session header, prompt_cache_key, user, metadata.user_id, an agent's session header, or inferred).",
       "class", "source"),
    _c("tailguard_programs", "Agent programs seen starting (a program's first call), by class and what named it.",
       "class", "source"),
    # What runs.
    _g("tailguard_state_shared", "1 while callers' limits and backends' slots are shared with the other replicas through Redis, 0 "
       "otherwise: no `state.url`, or Redis unavailable (state.on_unavailable applies)."),
    _g("tailguard_build_info", "1, labelled with the tailguard and Python versions running.", "version", "python"),
    _g("tailguard_config_info", "1, labelled with the config running now: its number in the config store and "
       "its hash (X-Tailguard-Config).", "number", "hash"),
    # The same requests in the OpenTelemetry GenAI conventions' names and buckets (Prometheus spelling).
    _h("gen_ai_server_time_to_first_token_seconds", "gen_ai.server.time_to_first_token: time to the first "
       "generated token, per successful request.", GENAI_TTFT_BUCKETS, "gen_ai_operation_name", "class"),
    _h("gen_ai_server_time_per_output_token_seconds", "gen_ai.server.time_per_output_token: (E2E - TTFT) / "
       "(output tokens - 1), per successful request.", GENAI_TPOT_BUCKETS, "gen_ai_operation_name", "class"),
    _h("gen_ai_server_request_duration_seconds", "gen_ai.server.request.duration: arrival to the last byte, "
       "every request.", GENAI_DURATION_BUCKETS, "gen_ai_operation_name", "class"),
    _h("gen_ai_client_token_usage", "gen_ai.client.token.usage: tokens per request, by gen_ai_token_type "
       "(input, output).", GENAI_TOKEN_BUCKETS, "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_token_type"),
    # The conventions' inference usage family (gen-ai-inference-usage-metrics.md): per-request histograms,
    # input and output apart, and counters of the tokens spent by modality; requests an engine answered.
    _h("gen_ai_client_inference_usage_input_tokens", "gen_ai.client.inference.usage.input_tokens: prompt tokens "
       "per request an engine answered.", GENAI_TOKEN_BUCKETS, "gen_ai_operation_name", "gen_ai_provider_name"),
    _h("gen_ai_client_inference_usage_output_tokens", "gen_ai.client.inference.usage.output_tokens: generated "
       "tokens per request an engine answered.", GENAI_TOKEN_BUCKETS, "gen_ai_operation_name", "gen_ai_provider_name"),
    _c("gen_ai_client_inference_usage_detailed_input_tokens", "gen_ai.client.inference.usage.detailed.input_tokens: "
       "prompt tokens spent, by gen_ai_token_modality.", "gen_ai_operation_name", "gen_ai_provider_name",
       "gen_ai_token_modality"),
    _c("gen_ai_client_inference_usage_detailed_output_tokens", "gen_ai.client.inference.usage.detailed.output_tokens: "
       "generated tokens spent, by gen_ai_token_modality.", "gen_ai_operation_name", "gen_ai_provider_name",
       "gen_ai_token_modality"),
)

BY_NAME = {m.name: m for m in METRICS}

# Families the standard collectors add (prometheus_client's process, platform and GC collectors);
# the dashboard may use them, but they are not defined here.
STANDARD = ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "python_info",
            "python_gc_collections_total", "process_start_time_seconds", "process_virtual_memory_bytes",
            "process_max_fds", "python_gc_objects_collected_total", "python_gc_objects_uncollectable_total")


def exposed_names() -> set[str]:
    """Every sample name `/metrics` may show: the catalog's series and the standard collectors'."""
    return {s for m in METRICS for s in m.series} | set(STANDARD)
