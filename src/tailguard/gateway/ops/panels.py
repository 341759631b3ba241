"""The dashboard's panels as PromQL over the catalog's metrics; pure, no I/O.

One table serves three readers: the Grafana JSON generator (`gateway.ops.dashboard`), the test that
runs every expression through a real Prometheus, and the PNG renderer that shows a reviewer what
an operator would see. `metrics_of` names the families an expression reads, so a test can tell a
metric with no panel from a panel with no metric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tailguard.gateway.ops.catalog import METRICS, STANDARD
from tailguard.wire import dcgm

# Grafana's template variables: name -> (the family whose label values it offers, that label).
# Outside Grafana each stands for "all".
VARIABLES = {"class": ("tailguard_requests_total", "class"), "backend": ("tailguard_backend_concurrency_limit", "backend"),
             "caller": ("tailguard_caller_requests_total", "caller"), "gpu_node": (dcgm.GPU_UTIL, "instance")}
RATE = "$__rate_interval"
GPU_ROW = "GPUs"
# Rows repeated once per value of a variable: the GPU row once per DCGM exporter Prometheus scrapes.
REPEATS = {GPU_ROW: "gpu_node"}


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    row: str
    title: str
    unit: str  # Grafana's unit id: s, reqps, percentunit, short, bytes
    description: str
    queries: tuple[Query, ...]


def _rate(family: str, by: str, sel: str = "") -> str:
    return f"sum by ({by}) (rate({family}{{{sel}}}[{RATE}]))"


def _p(q: float, family: str, by: str, sel: str = "") -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({family}_bucket{{{sel}}}[{RATE}])))"


C = 'class=~"$class"'
B = 'backend=~"$backend"'
K = 'caller=~"$caller"'
G = 'instance=~"$gpu_node"'


def _gpu(name: str) -> str:
    """A DCGM gauge per GPU of the nodes chosen (dcgm-exporter's `gpu` label; Prometheus's `instance`
    tells the nodes apart whatever the exporter's release calls its host label)."""
    return f"avg by (instance, gpu) ({name}{{{G}}})"

PANELS: tuple[Panel, ...] = (
    # Overview per class.
    Panel("Overview per class", "Requests by outcome", "reqps",
          "Every request ends once, with one outcome; a rising non-success share is the first sign of trouble.",
          (Query(_rate("tailguard_requests_total", "class, outcome", C), "{{class}} {{outcome}}"),)),
    Panel("Overview per class", "Tokens per second", "short",
          "Prompt and generated tokens of the requests an engine answered.",
          (Query(_rate("tailguard_output_tokens_total", "class", C), "{{class}} output"),
           Query(_rate("tailguard_prompt_tokens_total", "class", C), "{{class}} prompt"))),
    Panel("Overview per class", "Refused before a class", "reqps",
          "Bad keys and unreadable bodies, by status: a client misconfigured, not a capacity problem.",
          (Query(_rate("tailguard_unclassified_requests_total", "status"), "{{status}}"),)),
    Panel("Overview per class", "What runs", "short",
          "The tailguard version and the config (its hash, as X-Tailguard-Config) each gateway runs.",
          (Query("max by (version, python) (tailguard_build_info)", "tailguard {{version}} (Python {{python}})"),
           Query("max by (number, hash) (tailguard_config_info)", "config {{hash}} #{{number}}"),
           Query("min(tailguard_state_shared)", "limits shared through Redis (1) or not (0)"))),
    # Latency per class.
    Panel("Latency per class", "TTFT P50 and P99", "s",
          "Arrival at the gateway to the first generated token: what a chat user feels.",
          (Query(_p(0.99, "tailguard_ttft_seconds", "class", C), "{{class}} P99"),
           Query(_p(0.5, "tailguard_ttft_seconds", "class", C), "{{class}} P50"))),
    Panel("Latency per class", "SLO met (share of requests judged)", "percentunit",
          "Per class and target (`classes[].slo`: ttft, tpot, e2e), the share of requests that met it; refused and "
          "failed requests miss (docs/slo.md).",
          (Query(f"sum by (class, slo) (rate(tailguard_slo_total{{{C},result=\"met\"}}[{RATE}])) / "
                 f"sum by (class, slo) (rate(tailguard_slo_total{{{C}}}[{RATE}]))", "{{class}} {{slo}}"),)),
    Panel("Latency per class", "ITL P99 (per chunk)", "s",
          "Gaps between content chunks, pooled per chunk: a stall shows here.",
          (Query(_p(0.99, "tailguard_itl_seconds", "class", C), "{{class}} P99"),)),
    Panel("Latency per class", "E2E P99", "s", "Arrival to the last byte.",
          (Query(_p(0.99, "tailguard_e2e_seconds", "class", C), "{{class}} P99"),)),
    # Queue and shedding.
    Panel("Queue and shedding", "Queue length and limit", "short",
          "Requests waiting in the gateway; at the limit new ones are refused with queue_full.",
          (Query(f"sum by (class) (tailguard_queue_length{{{C}}})", "{{class}} queued"),
           Query(f"max by (class) (tailguard_class_queue_limit{{{C}}})", "{{class}} limit"))),
    Panel("Queue and shedding", "Queue wait P99 and bound", "s",
          "Close to the bound, the gateway starts refusing (wait_bound) rather than let a request wait past it.",
          (Query(_p(0.99, "tailguard_queue_wait_seconds", "class", C), "{{class}} P99"),
           Query(f"max by (class) (tailguard_class_queue_bound_seconds{{{C}}})", "{{class}} bound"))),
    Panel("Queue and shedding", "Rejections by reason", "reqps",
          "The same words as X-Tailguard-Reject-Reason and the access log's reason.",
          (Query(_rate("tailguard_rejected_total", "class, reason", C), "{{class}} {{reason}}"),)),
    # Backends and fleet.
    Panel("Backends and fleet", "Saturation (in flight / cap in force)", "percentunit",
          "At 100% the gateway's queue holds the rest: the cap binds, as it should under load.",
          (Query(f"sum by (backend) (tailguard_inflight{{{B}}}) / sum by (backend) "
                 f"(tailguard_backend_concurrency_limit{{{B}}})", "{{backend}}"),)),
    Panel("Backends and fleet", "Cap in force and in flight", "short",
          "Each backend's cap in force (its max_concurrency, or an adaptive cap as its latency sets it) and "
          "the requests in flight under it.",
          (Query(f"max by (backend) (tailguard_backend_concurrency_limit{{{B}}})", "{{backend}} cap"),
           Query(f"max by (backend) (tailguard_inflight{{{B}}})", "{{backend}} in flight"))),
    Panel("Backends and fleet", "Health and kind", "short",
          "1 while a backend's probes succeed; the kind it is treated as.",
          (Query(f"max by (backend) (tailguard_backend_healthy{{{B}}})", "{{backend}} healthy"),
           Query(f"max by (backend, kind) (tailguard_backend_kind{{{B}}})", "{{backend}} is {{kind}}"))),
    Panel("Backends and fleet", "Engine running and waiting", "short",
          "The engine's own counts; waiting above 0 means the gateway's cap is above the engine's slots.",
          (Query(f"max by (backend, state) (tailguard_backend_engine_requests{{{B}}})", "{{backend}} {{state}}"),)),
    Panel("Backends and fleet", "Stale backends", "short",
          "1 while a backend's probes or engine metrics have not answered within `routing.stale_after_s`: routing "
          "counts it as saturated.",
          (Query(f"max by (backend) (tailguard_backend_stale{{{B}}})", "{{backend}} stale"),)),
    Panel("Backends and fleet", "Upstream errors", "reqps", "Failed attempts by backend and how they failed.",
          (Query(_rate("tailguard_upstream_errors_total", "backend, kind", B), "{{backend}} {{kind}}"),)),
    Panel("Backends and fleet", "Tokens past max_tokens", "short",
          "Tokens a backend generated, or said it generated, past what its requests asked (n x max_tokens), "
          "charged to nobody: above 0, it ignores max_tokens or counts differently from the gateway.",
          (Query(_rate("tailguard_upstream_overrun_tokens_total", "backend", B), "{{backend}}"),)),
    Panel("Backends and fleet", "Health changes and ejections", "short",
          "Each backend's health changes (probes: unhealthy/healthy; passive: ejected/readmitted) and its "
          "ejections by the last failure, over the window: a flapping backend shows here first.",
          (Query(f"sum by (backend, to) (increase(tailguard_backend_health_changes_total{{{B}}}[{RATE}]))",
                 "{{backend}} {{to}}"),
           Query(f"sum by (backend, kind) (increase(tailguard_backend_ejections_total{{{B}}}[{RATE}]))",
                 "{{backend}} ejected ({{kind}})"))),
    Panel("Backends and fleet", "Capacity needed and ready", "short",
          "Backends the load needs to keep every class inside its bound, beside those ready: scale on this.",
          (Query("max by (pool) (tailguard_capacity_needed)", "{{pool}} needed"),
           Query("max by (pool) (tailguard_capacity_ready)", "{{pool}} ready"))),
    # Preemption and retries.
    Panel("Preemption and retries", "Preemptions", "reqps",
          "Running preemptible requests suspended for higher-ranked work (each resumes later).",
          (Query(_rate("tailguard_preemptions_total", "class", C), "{{class}}"),)),
    Panel("Preemption and retries", "Migrations", "reqps",
          "Streams continued on another backend after theirs died or stalled mid-answer, by why.",
          (Query(_rate("tailguard_migrations_total", "class, reason", C), "{{class}} {{reason}}"),)),
    Panel("Preemption and retries", "Hedges", "reqps",
          "Second attempts of hedged requests: sent, and whether they won, lost or failed.",
          (Query(_rate("tailguard_hedges_total", "class, outcome", C), "{{class}} {{outcome}}"),)),
    Panel("Preemption and retries", "Retries and denied retries", "reqps",
          "Failed attempts sent again, and those that could have been but were not (attempts, budget).",
          (Query(_rate("tailguard_retries_total", "backend, kind", B), "{{backend}} {{kind}} retried"),
           Query(_rate("tailguard_retries_denied_total", "backend, kind", B), "{{backend}} {{kind}} denied"))),
    # Callers.
    Panel("Callers", "Requests by caller", "reqps", "Per API key's name, by outcome (rate_limit refusals here).",
          (Query(_rate("tailguard_caller_requests_total", "caller, outcome", K), "{{caller}} {{outcome}}"),)),
    Panel("Callers", "Tokens by caller", "short", "What each caller's tpm_limit is charged.",
          (Query(_rate("tailguard_caller_tokens_total", "caller, kind", K), "{{caller}} {{kind}}"),)),
    # Agent programs.
    Panel("Agent programs", "Program calls and new programs", "reqps",
          "Calls known as part of an agent program, and programs starting, by what named them (docs/agents.md).",
          (Query(_rate("tailguard_program_calls_total", "source", C), "{{source}} calls"),
           Query(_rate("tailguard_programs_total", "source", C), "{{source}} new programs"))),
    # The same requests in the OpenTelemetry GenAI names.
    Panel("OpenTelemetry GenAI", "gen_ai.server TTFT, TPOT and duration P99", "s",
          "The GenAI conventions' histograms (their buckets), comparable with other conforming gateways.",
          (Query(_p(0.99, "gen_ai_server_time_to_first_token_seconds", "gen_ai_operation_name", C),
                 "{{gen_ai_operation_name}} TTFT"),
           Query(_p(0.99, "gen_ai_server_time_per_output_token_seconds", "gen_ai_operation_name", C),
                 "{{gen_ai_operation_name}} TPOT"),
           Query(_p(0.99, "gen_ai_server_request_duration_seconds", "gen_ai_operation_name", C),
                 "{{gen_ai_operation_name}} duration"))),
    Panel("OpenTelemetry GenAI", "gen_ai.client.token.usage P50", "short", "Tokens per request, input and output.",
          (Query(_p(0.5, "gen_ai_client_token_usage", "gen_ai_token_type"), "{{gen_ai_token_type}}"),)),
    Panel("OpenTelemetry GenAI", "gen_ai.client.inference.usage P99 per request", "short",
          "Input and output tokens per request an engine answered, by provider (the backend's kind): the "
          "outliers that fill a KV cache.",
          (Query(_p(0.99, "gen_ai_client_inference_usage_input_tokens", "gen_ai_provider_name"),
                 "{{gen_ai_provider_name}} input"),
           Query(_p(0.99, "gen_ai_client_inference_usage_output_tokens", "gen_ai_provider_name"),
                 "{{gen_ai_provider_name}} output"))),
    Panel("OpenTelemetry GenAI", "gen_ai.client.inference.usage.detailed tokens per second", "short",
          "Tokens spent, by provider and modality (chat prompts are `unknown`: engines give one count).",
          (Query(_rate("gen_ai_client_inference_usage_detailed_input_tokens_total",
                       "gen_ai_provider_name, gen_ai_token_modality"),
                 "{{gen_ai_provider_name}} input {{gen_ai_token_modality}}"),
           Query(_rate("gen_ai_client_inference_usage_detailed_output_tokens_total",
                       "gen_ai_provider_name, gen_ai_token_modality"),
                 "{{gen_ai_provider_name}} output {{gen_ai_token_modality}}"))),
    # Guards and the audit trail.
    Panel("Guards and audit", "Guard checks by verdict", "reqps",
          "Each guard's checks: passed, its action on a finding (block, redact, flag), or failed (error_open went "
          "on, error_closed refused or withheld).",
          (Query(_rate("tailguard_guard_checks_total", "guard, stage, verdict"), "{{guard}} {{stage}} {{verdict}}"),)),
    Panel("Guards and audit", "Guard check time P50 and P99", "s",
          "What a guard adds before a request is queued (input) or to a stream's chunks (output); bounded by its "
          "timeout_s.",
          (Query(_p(0.99, "tailguard_guard_seconds", "guard, stage"), "{{guard}} {{stage}} P99"),
           Query(_p(0.5, "tailguard_guard_seconds", "guard, stage"), "{{guard}} {{stage}} P50"))),
    Panel("Guards and audit", "Audit trail", "short",
          "Entries written per second, dropped (the queue was full) and failed writes; the queue waiting.",
          (Query(f"sum(rate(tailguard_audit_entries_total[{RATE}]))", "written /s"),
           Query(f"sum(rate(tailguard_audit_dropped_total[{RATE}]))", "dropped /s"),
           Query(f"sum(rate(tailguard_audit_write_failures_total[{RATE}]))", "failed writes /s"),
           Query("max(tailguard_audit_queue_length)", "queued"))),
    Panel("Process", "Connections closed by the gateway", "reqps",
          "Slow or idle clients cut (header_timeout, evicted_idle) and connections refused at the cap (over_cap).",
          (Query(_rate("tailguard_connections_closed_total", "reason"), "{{reason}}"),)),
    # The gateway's own process.
    Panel("Process", "Memory and CPU", "short", "Resident memory (MiB) and CPU (cores) of each gateway process.",
          (Query("process_resident_memory_bytes / 1048576", "{{instance}} RSS MiB"),
           Query(f"rate(process_cpu_seconds_total[{RATE}])", "{{instance}} CPU cores"))),
    # The GPUs under the engines, from NVIDIA's DCGM exporter (the simulator exports the same names).
    Panel(GPU_ROW, "GPU utilization and SM activity", "percentunit",
          "Utilization and engine activity are the time a kernel ran (100% whenever the engine works); SM activity "
          "is how full the SMs were, what `tailguard doctor`'s compute_bound reads (add DCGM_FI_PROF_SM_ACTIVE to "
          "dcgm-exporter's counters to have it).",
          (Query(f"{_gpu(dcgm.GPU_UTIL)} / 100", "{{instance}} gpu {{gpu}} utilization"),
           Query(_gpu(dcgm.GR_ENGINE_ACTIVE), "{{instance}} gpu {{gpu}} engine active"),
           Query(_gpu(dcgm.SM_ACTIVE), "{{instance}} gpu {{gpu}} SM active"))),
    Panel(GPU_ROW, "GPU memory used", "percentunit",
          "Framebuffer used over used + free: weights, the KV pool and activations (vLLM reserves its KV pool at "
          "start; vllm:kv_cache_usage_perc says how full that pool is).",
          (Query(f"{_gpu(dcgm.FB_USED)} / ({_gpu(dcgm.FB_USED)} + {_gpu(dcgm.FB_FREE)})", "{{instance}} gpu {{gpu}}"),)),
    Panel(GPU_ROW, "Power and its limit", "watt",
          "Power drawn against the card's limit (DCGM_FI_DEV_POWER_MGMT_LIMIT, added to the counters): a card at its "
          "limit lowers its clocks.",
          (Query(_gpu(dcgm.POWER_USAGE), "{{instance}} gpu {{gpu}} drawn"),
           Query(_gpu(dcgm.POWER_LIMIT), "{{instance}} gpu {{gpu}} limit"))),
    Panel(GPU_ROW, "SM clock and its maximum", "hertz",
          "A clock that falls while the card works is a card held down by power or heat (doctor's throttled).",
          (Query(f"{_gpu(dcgm.SM_CLOCK)} * 1e6", "{{instance}} gpu {{gpu}} SM clock"),
           Query(f"{_gpu(dcgm.MAX_SM_CLOCK)} * 1e6", "{{instance}} gpu {{gpu}} maximum"))),
)

_FAMILY = re.compile(r"\b((?:tailguard|gen_ai|process|python)_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)")
_SUFFIXES = ("_bucket", "_count", "_sum")


def metrics_of(expr: str) -> set[str]:
    """The catalog families (or standard series) an expression reads."""
    names = set()
    for word in _FAMILY.findall(expr):
        if word in _LABELS:
            continue
        for suffix in _SUFFIXES:
            if word.endswith(suffix) and word[: -len(suffix)] in _HISTOGRAMS:
                word = word[: -len(suffix)]
        names.add(word)
    return names


_HISTOGRAMS = {m.name for m in METRICS if m.kind == "histogram"}
_LABELS = {label for m in METRICS for label in m.labels}


def known() -> set[str]:
    """What an expression may name: each catalog family as PromQL names it, the standard series,
    and the DCGM exporter's gauges (`wire.dcgm`)."""
    return {m.exposed for m in METRICS} | set(STANDARD) | set(dcgm.HELP)


def outside_grafana(expr: str, rate_window: str = "1m") -> str:
    """The expression with Grafana's variables filled in for "all", to run on Prometheus itself."""
    for name in VARIABLES:
        expr = expr.replace(f"${name}", ".*")
    return expr.replace(RATE, rate_window)
