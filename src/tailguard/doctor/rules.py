"""One rule per finding kind: each reads `RunFacts` (and the servers' evidence, when scraped) and
returns a `Finding` or None (pure, no I/O). The thresholds are the article's where it gives one
(a P99/P50 within 3-5x is a healthy tail; near 20x is the disease, section 7.4) and stated with
their reason otherwise. docs/doctor.md lists each rule in words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tailguard.doctor.evidence import EngineEvidence, GatewayEvidence
from tailguard.doctor.facts import QUEUE_PARTS, TTFT_PARTS, ClassFacts, RunFacts, share, shared_prefix_share
from tailguard.doctor.finding import Finding
from tailguard.doctor.words import pct, secs, times

TAIL_RATIO = 5.0  # P99/P50 above the article's 3-5x band is a tail worth fixing
QUEUED = 0.5  # "most of its time was spent queued"
TTFT_HIGH_ITLS = 10.0  # a first token later than ten steady decode steps is a slow first token
# ...and one that is most of the request's time (the article's test, 7.3: is TTFT close to the
# whole request, or a small part of it?)
TTFT_OF_E2E = 0.5
LONG_VS_SHORT = 4.0  # a class asking 4x the output of another holds its slots 4x as long
FAIL_SHARE = 0.01  # 1% of requests refused or timed out is not noise

Rule = Callable[[RunFacts, "EngineEvidence | None", "GatewayEvidence | None"], "Finding | None"]


def bench_command(f: RunFacts, url: str | None = None, out: str | None = None) -> str:
    """The `tailguard bench` command that repeats this run (optionally at another URL), writing
    beside it (`RUN-after` unless `out` says)."""
    m = f.meta
    w = (m.get("workload") or {}).get("name", "seed-mixed")
    size = f"--requests {m['requests']}" if m.get("requests") else f"--duration {m.get('duration_s')}"
    ts = f" --time-scale {m['time_scale']}" if m.get("time_scale", 1.0) != 1.0 else ""
    return (f"tailguard bench --url {url or m.get('url', 'URL')} --workload {w} {_load(f)} {size} "
            f"--seed {m.get('seed', 0)}{ts} --out {out or _after(f)}")


def lighter_command(f: RunFacts, share: float = 0.7) -> str:
    """This run's bench at `share` of its load (rate or clients)."""
    rate = f.meta.get("rate")
    lower = f"--rate {rate * share:g}" if rate else f"--concurrency {max(1, int((f.meta.get('concurrency') or 2) * share))}"
    return bench_command(f).replace(_load(f), lower)


def _load(f: RunFacts) -> str:
    m = f.meta
    return f"--concurrency {m['concurrency']}" if m.get("concurrency") else f"--rate {m.get('rate')}"


def _after(f: RunFacts) -> str:
    return f"{f.run_dir.rstrip('/')}-after"


def compare_command(f: RunFacts, after: str | None = None) -> str:
    return f"tailguard bench compare {f.run_dir} {after or _after(f)}"


def slo_target(c: ClassFacts, metric: str) -> str:
    """An SLO to sweep against: 3x the class's P50 (the low end of a healthy tail, 3-5x)."""
    p50 = getattr(c, f"{metric}_p50") or 0.0
    return f"{c.name}:{metric}_s={max(3 * p50, 0.001):.3g}"


def _engine(f: RunFacts) -> tuple[str, str] | None:
    """(URL, kind) of the engine behind the run: the gateway's first backend, or the run's own URL
    when it went straight to the engine."""
    if f.gateway is not None and f.gateway.backends:
        b = f.gateway.backends[0]
        return b.url, b.kind
    kind = "sim" if f.meta.get("engine") == SIMULATOR else "vllm"  # the simulator names itself (/version)
    return (f.meta["url"], kind) if not f.behind_gateway and f.meta.get("url") else None


def sweep_command(f: RunFacts, setting: str, values: str, slo: str) -> str:
    """`tailguard sweep` of one setting at this run's load, against its engine behind a gateway
    restarted per value (on the discrete-event simulator when the engine is unknown)."""
    w = (f.meta.get("workload") or {}).get("name", "seed-mixed")
    where = ""
    found = _engine(f)
    if found is not None:
        url, kind = found
        where = f" --backend {url} --backend-kind {kind}"
        if f.meta.get("time_scale", 1.0) != 1.0:
            where += f" --time-scale {f.meta['time_scale']}"
    return (f"tailguard sweep --setting {setting} --values {values} --slo {slo} --workload {w} {_load(f)}"
            f"{where} --out {f.run_dir.rstrip('/')}-sweep")


def _cap(f: RunFacts) -> int | None:
    """The first backend's max_concurrency as the run's gateway had it."""
    return f.gateway.backends[0].max_concurrency if f.gateway is not None and f.gateway.backends else None


def _by_output(f: RunFacts) -> tuple[ClassFacts, ClassFacts] | None:
    cs = [c for c in f.classes.values() if c.count]
    if len(cs) < 2:
        return None
    cs.sort(key=lambda c: c.max_tokens)
    return cs[0], cs[-1]


def head_of_line(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    pair = _by_output(f)
    if pair is None:
        return None
    short, long = pair
    ratio = max(short.ratio("e2e") or 0.0, short.ratio("ttft") or 0.0)
    queued = share(short.tail, QUEUE_PARTS)
    if long.max_tokens < LONG_VS_SHORT * short.max_tokens or ratio < TAIL_RATIO or queued < QUEUED \
            or short.others_in_flight_at_tail < 1:
        return None
    against = []
    if (long.ratio("e2e") or 0) >= TAIL_RATIO:
        against.append(f"{long.name} has a long tail too (E2E P99/P50 {times(long.ratio('e2e'))}): load, not only order")
    if short.rejected or short.timeouts:
        against.append(f"{short.name} also lost {short.rejected + short.timeouts} requests to refusals or timeouts")
    if f.behind_gateway:
        step, check = _hold_fewer(f, short, long)
    else:
        slots, said = _engine_slots(engine)
        step = ("put `tailguard serve` in front of the engine: the ranked-sjf policy with `max_concurrency` equal "
                f"to the engine's max_num_seqs ({said}), so a {short.name} request waits for the next free slot, "
                f"not behind every queued {long.name} request")
        check = (f"tailguard serve --backend {f.meta.get('url', 'URL')} --max-concurrency {slots}; "
                 f"{bench_command(f, 'http://127.0.0.1:8080')}; {compare_command(f)}")
    return Finding(
        "head_of_line", "high",
        symptom=(f"{short.name} E2E P99 {secs(short.e2e_p99)} vs P50 {secs(short.e2e_p50)} (P99/P50 {times(short.ratio('e2e'))}, "
                 f"TTFT {times(short.ratio('ttft'))}) while {long.name} asks for {long.max_tokens:.0f} tokens "
                 f"against {short.max_tokens:.0f}"),
        cause=f"a few long {long.name} generations hold the engine's batch slots; {short.name} requests queue behind them",
        next_step=step, check=check,
        evidence_for=(f"the slowest 1% of {short.name} spent {pct(queued)} of their time queued "
                      f"(engine {secs(short.tail['engine_queue_s'])}, gateway {secs(short.tail['gateway_queue_s'])})",
                      f"when they were sent, {short.others_in_flight_at_tail:.1f} other requests were in flight on average"),
        evidence_against=tuple(against),
    )


def _engine_slots(engine: EngineEvidence | None) -> tuple[int, str]:
    """The engine's batch slots as far as the run shows them, and how that is known."""
    if engine is not None and engine.running_max:
        return int(engine.running_max), f"it ran at most {engine.running_max:.0f} at once"
    return 8, "8 is the gateway's default: use the engine's own --max-num-seqs if it differs"


def _hold_fewer(f: RunFacts, short: ClassFacts, long: ClassFacts) -> tuple[str, str]:
    """Behind the gateway already: the next change, from what it was told (nothing it has on
    already), and the sweep that checks it."""
    ways = []
    view = f.gateway
    cls = long.server_class or long.name
    if view is None or not (view.preemption and cls in view.preemptible):
        ways.append(f"`preemption: true` with `preemptible: true` on the {cls} class")
    ways.append(f"a `max_share` below 1 or a lower `max_tokens_cap` for the {cls} class")
    cap = _cap(f)
    ways.append(f"a lower `max_concurrency` than {cap}" if cap is not None and cap > 1 else "a lower `max_concurrency`")
    step = f"the gateway is in front already: let it hold fewer {long.name} requests: " + ", or ".join(ways)
    return step, sweep_command(f, "max_concurrency", _cap_values(f, lower=True), slo_target(short, "e2e"))


def _ttft_slow(f: RunFacts) -> list[ClassFacts]:
    if f.itl_p50 is None:
        return []
    step = max(f.itl_p50, 1e-3)
    return [c for c in f.classes.values() if c.ttft_p99 is not None and c.e2e_p99 is not None
            and c.ttft_p99 > TTFT_HIGH_ITLS * step and c.ttft_p99 >= TTFT_OF_E2E * c.e2e_p99]


def _cap_values(f: RunFacts, *, lower: bool = False) -> str:
    """About seven max_concurrency values around the run's own, up to twice it (`lower`: up to
    it; 2 to 32, or 16, when it had none), kept below a closed loop's clients: a cap at or above
    them never binds (`sweep` would say so)."""
    cap = _cap(f)
    low, high = (max(1, cap // 4), cap if lower else cap * 2) if cap else (2, 16 if lower else 32)
    clients = f.meta.get("concurrency") if f.meta.get("mode") == "closed" else None
    if clients:
        high = max(low, min(high, int(clients) - 1))
    step = max(1, (high - low) // 6)
    return f"{low}..{high}:{step}" if step > 1 else f"{low}..{high}"


def _by_design(f: RunFacts, c: ClassFacts) -> bool:
    """`c` waited in the gateway because the gateway was told to serve another class of the run
    first, and lost nothing to it: the intended queueing of a lower class, not a fault."""
    if f.gateway is None or c.rejected + c.timeouts >= FAIL_SHARE * max(c.count, 1):
        return False
    if c.ttft_tail.get("gateway_queue_s", 0.0) < c.ttft_tail.get("engine_queue_s", 0.0):
        return False
    view = f.gateway
    return any(view.waits_by_design(c, o) for o in f.classes.values() if o is not c and o.count)


def queueing(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    slow = [c for c in _ttft_slow(f) if share(c.ttft_tail, QUEUE_PARTS, TTFT_PARTS) >= QUEUED and not _by_design(f, c)]
    if not slow:
        return None
    c = max(slow, key=lambda c: c.ttft_p99 or 0.0)
    q = share(c.ttft_tail, QUEUE_PARTS, TTFT_PARTS)
    where = "gateway" if c.ttft_tail["gateway_queue_s"] > c.ttft_tail["engine_queue_s"] else "engine"
    evid = [f"the slowest 1% by TTFT spent {pct(q)} of it queued (mostly in the {where}), prefill {secs(c.ttft_tail['prefill_s'])}"]
    if engine is not None and engine.queue_time_mean_s is not None:
        evid.append(f"the engine's own queue-time histogram: mean {secs(engine.queue_time_mean_s)} per request")
    return Finding(
        "queueing", "medium",
        symptom=(f"{c.name} TTFT P99 {secs(c.ttft_p99)} (P50 {secs(c.ttft_p50)}) of an E2E P99 {secs(c.e2e_p99)}; "
                 f"a decode step takes {secs(f.itl_p50)}"),
        cause=f"the first token waits in the {where}'s queue, not in prefill",
        next_step=("shorten the queue: fewer requests in flight per engine (a gateway `max_concurrency` that binds), "
                   "a priority for this class, or more capacity"),
        check=sweep_command(f, "max_concurrency", _cap_values(f), slo_target(c, "ttft")),
        evidence_for=tuple(evid),
    )


HIDDEN = 0.1  # the engine accounts for under a tenth of the wait the client saw before its first token


def hidden_queue(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    """The client saw its requests wait before the first token, but the engine says it queued
    them hardly at all: the wait is between the two (the article's table 10: stuck at high
    concurrency, a thread pool or a lock). Needs the engine's queue-time histogram."""
    if engine is None or engine.queue_time_mean_s is None:
        return None
    slow = [c for c in _ttft_slow(f) if share(c.ttft_tail, ("engine_queue_s",), TTFT_PARTS) >= QUEUED]
    if not slow:
        return None
    c = max(slow, key=lambda c: c.ttft_tail["engine_queue_s"])
    seen = c.ttft_tail["engine_queue_s"]
    if engine.queue_time_mean_s >= HIDDEN * seen:
        return None
    return Finding(
        "hidden_queue", "high",
        symptom=(f"{c.name}: its slowest first tokens waited {secs(seen)} before the engine began them, "
                 f"but the engine reports a mean queue time of {secs(engine.queue_time_mean_s)}"),
        cause=("something between the client and the engine lets requests through one (or a few) at a time: a "
               "lock or a small worker pool in the server's HTTP layer or a proxy, or a connection limit"),
        next_step=("find the serialization: run the same load straight to the engine's port and compare TTFT; "
                   "check the proxy's or server's worker and connection limits"),
        check=_straight_check(f),
        evidence_for=(f"the engine ran at most {engine.running_max or 0:.0f} requests at once",
                      f"{pct(share(c.ttft_tail, ('engine_queue_s',), TTFT_PARTS))} of the slowest TTFTs was waiting"),
    )


def _straight_check(f: RunFacts) -> str:
    """The run again straight to its engine, then compared; the engine's URL from the gateway's
    settings (a run straight to the engine repeats at its own URL)."""
    found = _engine(f)
    straight = f"{f.run_dir.rstrip('/')}-straight"
    return f"{bench_command(f, url=found[0] if found else None, out=straight)}; {compare_command(f, straight)}"


def prefill(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    slow = [c for c in _ttft_slow(f) if share(c.ttft_tail, ("prefill_s",), TTFT_PARTS) >= QUEUED]
    if not slow:
        return None
    c = max(slow, key=lambda c: c.ttft_p99 or 0.0)
    prompts = sorted(r.prompt_tokens for r in c.records)
    evid = [f"the slowest 1% by TTFT spent {pct(share(c.ttft_tail, ('prefill_s',), TTFT_PARTS))} of it in prefill "
            f"({secs(c.ttft_tail['prefill_s'])}); its prompts: median {prompts[len(prompts) // 2]} tokens"]
    if engine is not None and engine.prefill_time_mean_s is not None:
        evid.append(f"the engine's prefill-time histogram: mean {secs(engine.prefill_time_mean_s)}")
    return Finding(
        "prefill", "medium",
        symptom=f"{c.name} TTFT P99 {secs(c.ttft_p99)} of an E2E P99 {secs(c.e2e_p99)}; a decode step takes {secs(f.itl_p50)}",
        cause="long prompts: the first token waits for the prompt's own prefill",
        next_step=("shorten what is prefilled: enable the engine's prefix cache for shared prefixes, cap the prompt "
                   "(`max_prompt_tokens`), or send long-prompt work as its own class"),
        check=f"{bench_command(f)}  # with prefix caching on; then {compare_command(f)}",
        evidence_for=tuple(evid),
    )


def overload(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    cs = [c for c in f.classes.values() if c.count]
    refused = sum(c.rejected for c in cs)
    all_queued = bool(cs) and all(c.median_queue_share >= QUEUED for c in cs)
    if refused < FAIL_SHARE * f.requests and not all_queued:
        return None
    evid = [f"{c.name}: the median request spent {pct(c.median_queue_share)} of its E2E queued (P50 {secs(c.e2e_p50)})" for c in cs]
    if refused:
        evid.append(f"{refused} of {f.requests} requests refused with 429/503")
    if gw is not None and gw.rejected:
        evid.append("the gateway's refusals: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(gw.rejected.items())))
    return Finding(
        "overload", "high",
        symptom="every class is slow at the median, not only in the tail" + (f"; {refused} requests refused" if refused else ""),
        cause="the offered load is above what the engine serves: requests queue whatever their order",
        next_step=("offer less load per engine (fewer clients, a lower rate) or add engine instances; behind the "
                   "gateway a bounded queue turns the excess into fast 429/503 with Retry-After"),
        check=lighter_command(f),
        evidence_for=tuple(evid),
    )


def starvation(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    cs = [c for c in f.classes.values() if c.count]
    if len(cs) < 2 or not f.behind_gateway:
        return None
    starved = max(cs, key=lambda c: c.median_gateway_share)
    favoured = min(cs, key=lambda c: c.median_gateway_s)
    refused = starved.rejected / starved.count
    waits_more = starved.median_gateway_s >= LONG_VS_SHORT * max(favoured.median_gateway_s, 1e-3)
    if not ((starved.median_gateway_share >= QUEUED and waits_more) or refused >= FAIL_SHARE) \
            or (favoured.ratio("e2e") or 0.0) >= TAIL_RATIO or favoured.rejected > FAIL_SHARE * favoured.count \
            or _by_design(f, starved):
        return None
    return Finding(
        "starvation", "medium",
        symptom=(f"{starved.name} waits in the gateway: its median request spends {pct(starved.median_gateway_share)} "
                 f"of its E2E there ({secs(starved.median_gateway_s)}; P50 {secs(starved.e2e_p50)}), {pct(refused)} "
                 f"refused; {favoured.name}'s median waits {secs(favoured.median_gateway_s)}"),
        cause=f"priorities: {favoured.name} takes the slots as fast as they free, so {starved.name} runs only in the gaps",
        next_step=(f"reserve capacity for {starved.name}: a `min_share` for its class, or `aging_s` so a waiting "
                   f"request gains priority with time"),
        check=sweep_command(f, "aging_s", "1,5,10,30", slo_target(favoured, "e2e")),
        evidence_for=(f"{favoured.name} is served well: E2E P99/P50 {times(favoured.ratio('e2e'))}, P99 {secs(favoured.e2e_p99)}",),
    )


def client_timeouts(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    timed = [r for c in f.classes.values() for r in c.records if r.timed_out]
    streaming = [r for r in timed if r.timeout_phase == "total" and r.chunk_at]
    if len(timed) < max(1.0, FAIL_SHARE * f.requests) or len(streaming) < len(timed) / 2:
        return None
    ok = [r for c in f.classes.values() for r in c.records if r.ok]
    longest = max((r.e2e_s for r in ok), default=0.0)
    gaps = sorted(r.ended_at - r.chunk_at[-1] for r in streaming)
    evid = [f"{len(streaming)} of {len(timed)} timed-out requests were still receiving tokens when the client "
            f"gave up (median {secs(gaps[len(gaps) // 2])} after their last token)"]
    against = []
    if engine is not None and engine.successes is not None:
        evid.append(f"the engine finished {engine.successes:.0f} requests during the run; the client counted {len(ok)} successes")
    if f.meta.get("timeouts"):
        evid.append(f"the client's total timeout: {f.meta['timeouts'].get('total_s')} s (wall)")
    if any(r.error_kind not in (None, "timeout") for c in f.classes.values() for r in c.records):
        against.append("the server also failed some requests outright")
    return Finding(
        "client_timeouts", "high",
        symptom=f"{len(timed)} of {f.requests} requests timed out at the client while the server was still generating",
        cause="the client's fixed total timeout is shorter than a long generation takes",
        next_step=("replace the fixed total timeout by a first-token timeout plus an idle timeout between tokens "
                   "(tailguard.client's Timeouts), or derive the total from max_tokens"),
        # --timeout is wall seconds; the run's times are simulated when it had a time scale
        check=bench_command(f) + f" --timeout {max(longest * f.meta.get('time_scale', 1.0) * 2, 1.0):.0f}",
        evidence_for=tuple(evid), evidence_against=tuple(against),
    )


def kv_pressure(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    if engine is None or not ((engine.preemptions or 0) > 0 or (engine.kv_usage_max or 0) >= 0.95):
        return None
    stalled = max(f.classes.values(), key=lambda c: share(c.tail, ("stall_s",)))
    stall = share(stalled.tail, ("stall_s",))
    itl = stalled.ratio("itl")
    if stall < 0.05 and (itl or 0) < 3:
        return None
    return Finding(
        "kv_pressure", "high",
        symptom=(f"{stalled.name}: stalls make {pct(stall)} of its slowest 1%'s time; ITL P99/P50 {times(itl)}"),
        cause="the KV cache is full: the engine preempts running sequences and recomputes them",
        next_step=("hold fewer sequences in the engine at once (a lower `max_num_seqs`, or a gateway "
                   "`max_concurrency` below it) or shorten `max_model_len`; more KV memory if you have it"),
        check=sweep_command(f, "max_concurrency", _cap_values(f), slo_target(stalled, "e2e")),
        evidence_for=(f"engine preemptions during the run: {engine.preemptions or 0:.0f}",
                      f"KV cache usage max {pct(engine.kv_usage_max or 0)} over {engine.snapshots} snapshots"),
    )


def cap_above_engine(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    seen = [w for w in (engine.waiting_max if engine else None, gw.engine_waiting_max if gw else None) if w is not None]
    if not f.behind_gateway or max(seen, default=0.0) < 1:
        return None
    # The engine queued requests the gateway had already let through, and that is where a tail waited.
    c = max(f.classes.values(), key=lambda c: c.tail["engine_queue_s"])
    if c.tail["engine_queue_s"] <= max(c.tail["gateway_queue_s"], 0.0) or share(c.tail, ("engine_queue_s",)) < 0.25:
        return None
    return Finding(
        "cap_above_engine", "medium",
        symptom=(f"behind the gateway, {c.name}'s slowest 1% still waited {secs(c.tail['engine_queue_s'])} in the engine's "
                 f"own queue (gateway queue {secs(c.tail['gateway_queue_s'])})"),
        cause="the gateway's max_concurrency is above the engine's batch slots, so requests queue in the engine, in its order",
        next_step=("set the backend's `max_concurrency` to the engine's max_num_seqs"
                   + (f" (it ran at most {engine.running_max:.0f} at once)" if engine and engine.running_max else "")
                   + ", so waiting happens in the gateway's queue"),
        check=sweep_command(f, "max_concurrency", _cap_values(f), slo_target(c, "e2e")),
        evidence_for=(f"the engine's own queue held up to {max(seen):.0f} requests"
                      + (f" (mean {engine.waiting_mean or 0:.2f} over {engine.snapshots} engine snapshots)" if engine else
                         " (the gateway's tailguard_backend_engine_requests{state=\"waiting\"})"),),
    )


def prefix_misses(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    shared = shared_prefix_share(f.meta)
    if not shared or engine is None or engine.prefix_queried_tokens is None:
        return None
    expected = sum(shared.values()) / len(shared)
    rate = engine.prefix_hit_rate
    if rate is not None and rate >= expected / 2:
        return None
    seen = "no prefix-cache queries at all (prefix caching is off)" if not rate and not engine.prefix_queried_tokens \
        else f"prefix-cache hit rate {pct(rate or 0)}"
    return Finding(
        "prefix_misses", "medium",
        symptom=f"{seen}, though {', '.join(shared)} send a shared system prompt ({pct(expected)} of a prompt)",
        cause="shared prefixes are prefilled again for every request",
        next_step="enable the engine's prefix cache (vLLM: --enable-prefix-caching; `tailguard sim --enable-prefix-caching`)",
        check=(f"{bench_command(f)}  # against the engine with prefix caching on; then tailguard doctor {_after(f)} "
               f"--engine-metrics {(_engine(f) or (f.meta.get('url', 'URL'),))[0]}"),
        evidence_for=(f"prefix-cache tokens queried {engine.prefix_queried_tokens:.0f}, hit {engine.prefix_hit_tokens or 0:.0f}",),
    )


def generator_bound(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    if f.valid:
        return None
    v = f.summary.get("validity", {})
    return Finding(
        "generator_bound", "high",
        symptom=f"the load generator fell behind its schedule: {f.validity_reason}",
        cause="the machine running the bench could not send on time, so the latencies are partly the generator's",
        next_step="give the generator its own cores (or another machine), or offer less load from one process",
        check=bench_command(f),
        evidence_for=(f"dispatch lag P99 {secs(v.get('dispatch_lag_p99_s'))}, threshold {secs(v.get('threshold_s'))}",),
    )


SIMULATOR = "tailguard-sim"  # what `tailguard sim` answers at /version (the bench records it as `engine`)
BURST_MIN_CHUNKS = 8  # a stream this long cannot arrive in one read unless something held it back
BURST_SPAN = 0.05  # all of its chunks within 5% of its E2E...
BURST_TTFT = 0.8  # ...and its first token after 80% of it: the stream came in one burst at the end


def buffered_stream(f: RunFacts, engine: EngineEvidence | None, gw: GatewayEvidence | None) -> Finding | None:
    """Streams that arrive whole at their end: something between the client and the engine
    buffers SSE (the article's table 10: a proxy buffering the stream). Not on a run straight to
    `tailguard sim`, which sends each token as it makes it: there, such a stream queued for most
    of its time and then decoded quickly, which is what `queueing` and `overload` are about."""
    if not f.behind_gateway and f.meta.get("engine") == SIMULATOR:
        return None
    long = [r for c in f.classes.values() for r in c.records
            if r.ok and r.stream and len(r.chunk_at) >= BURST_MIN_CHUNKS and r.ttft_s is not None and r.e2e_s > 0]
    burst = [r for r in long if r.chunk_at[-1] - r.chunk_at[0] < BURST_SPAN * r.e2e_s
             and r.ttft_s is not None and r.ttft_s > BURST_TTFT * r.e2e_s]
    if not long or len(burst) < len(long) / 2:
        return None
    spans = sorted(r.chunk_at[-1] - r.chunk_at[0] for r in burst)
    ttfts = sorted(r.ttft_s / r.e2e_s for r in burst if r.ttft_s is not None)
    return Finding(
        "buffered_stream", "high",
        symptom=(f"{len(burst)} of {len(long)} streamed answers of {BURST_MIN_CHUNKS}+ chunks arrived in one burst "
                 f"at their end: first token at {pct(ttfts[len(ttfts) // 2])} of the request's time (median), "
                 f"all chunks within {secs(spans[len(spans) // 2])}"),
        cause=("something between the client and the engine buffers the SSE stream (a proxy with buffering on, "
               "such as nginx's proxy_buffering, a CDN, or a compressing middleware), so TTFT is the whole request"),
        next_step=("turn buffering off on the stream's way (nginx: `proxy_buffering off;`, or honour the "
                   "`X-Accel-Buffering: no` header the gateway sends); tailguard's own relay never buffers"),
        check=bench_command(f) + "  # then the same straight to the engine: its chunks should be spread out",
        evidence_for=(f"{len(burst)} bursts among {len(long)} long streams",),
    )


RULES: dict[str, Rule] = {
    "head_of_line": head_of_line, "overload": overload, "starvation": starvation,
    "client_timeouts": client_timeouts, "cap_above_engine": cap_above_engine, "hidden_queue": hidden_queue,
    "kv_pressure": kv_pressure,
    "queueing": queueing, "prefill": prefill, "prefix_misses": prefix_misses, "buffered_stream": buffered_stream,
    "generator_bound": generator_bound,
}


def findings_json(findings: list[Finding]) -> dict[str, Any]:
    return {"findings": [x.to_json() for x in findings]}
