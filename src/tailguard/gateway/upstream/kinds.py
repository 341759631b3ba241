"""What differs between the inference servers behind the gateway, per backend kind; pure, no I/O.

A kind says where the engine reports its own load and how to read it, which request field carries
the engine's own priority and how a class rank maps onto it, which path answers health probes, and
which request headers smooth the server's quirks. Every fact here was observed on the real server
(tests/real) or is cited from its documentation in docs/engines.md.

    kind = get_kind("llamacpp")
    for source in kind.load_sources:            # the I/O side GETs source.path ...
        load = source.parse(body)               # ... and this turns the page into EngineLoad
    kind.priority_for(rank)                     # -> ("priority", value) or None
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Requests inside the engine, as the engine itself reports them."""

    running: int  # being decoded (in a batch slot)
    waiting: int  # queued inside the engine (its own FCFS or priority queue)

    @property
    def total(self) -> int:
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class LoadSource:
    """One page that reports load: GET `path`, hand the body to `parse` (None: page not understood)."""

    path: str
    parse: Callable[[bytes], EngineLoad | None]


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    health_path: str
    load_sources: tuple[LoadSource, ...] = ()
    priority_field: str | None = None
    rank_to_priority: Callable[[int], int] | None = None
    upstream_headers: Mapping[str, str] = field(default_factory=dict)
    # Can resume a generation where it stopped: chat with a trailing assistant message that the
    # model continues (vLLM: `continue_final_message`; llama-server continues a trailing assistant
    # message by itself), and completions with the generated text appended to the prompt. The
    # gateway suspends (preempts) requests only on such backends.
    continues_generation: bool = False
    # True where every content chunk carries exactly one token, so counting chunks counts tokens
    # (seen on llama-server). vLLM merges several tokens into one chunk whenever its API server
    # runs behind the engine, so a count of chunks falls short there.
    one_token_per_chunk: bool = False
    # `stream_options` fields that make every chunk carry the running `usage` (completion tokens so
    # far): how to know how many tokens a stream has produced where chunks are not tokens.
    running_usage_options: Mapping[str, Any] = field(default_factory=dict)
    # Sends its response head only with the first result (llama-server waits for it so that an
    # error can still get its own status): no response-head deadline apart from the first token's.
    head_with_first_token: bool = False
    # Returns each chunk's token ids when asked (`return_token_ids`, vLLM 0.10.2 and later) and
    # takes a token-id prompt on /v1/completions: a stream can be continued by ids, not text.
    continues_by_ids: bool = False

    def priority_for(self, rank: int) -> tuple[str, int] | None:
        """The request field and value that give a class of `rank` its place in the engine's own
        queue, or None when the engine has no such field."""
        if self.priority_field is None or self.rank_to_priority is None:
            return None
        return self.priority_field, self.rank_to_priority(rank)


# --- Prometheus text pages ----------------------------------------------------------------------

def prometheus_sums(page: bytes, names: Iterable[str]) -> dict[str, float]:
    """Sum every sample of each wanted metric over all its label sets (vLLM labels by engine and
    model; a data-parallel server reports one series per rank). Names absent from the page are
    absent from the result. Comment lines, other metrics and unparsable values are skipped."""
    wanted = set(names)
    sums: dict[str, float] = {}
    for raw in page.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if space < 0:
            continue
        if 0 <= brace < space:
            name = line[:brace]
            close = line.find("}", brace)
            if close < 0:
                continue
            rest = line[close + 1:].split()
        else:
            name = line[:space]
            rest = line[space + 1:].split()
        if name not in wanted or not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        sums[name] = sums.get(name, 0.0) + value
    return sums


def _gauges(running: str, waiting: str) -> Callable[[bytes], EngineLoad | None]:
    def parse(page: bytes) -> EngineLoad | None:
        s = prometheus_sums(page, (running, waiting))
        if running not in s:
            return None
        return EngineLoad(running=max(0, round(s[running])), waiting=max(0, round(s.get(waiting, 0.0))))

    return parse


parse_vllm_metrics = _gauges("vllm:num_requests_running", "vllm:num_requests_waiting")
parse_llamacpp_metrics = _gauges("llamacpp:requests_processing", "llamacpp:requests_deferred")
parse_sglang_metrics = _gauges("sglang:num_running_reqs", "sglang:num_queue_reqs")
parse_tgi_metrics = _gauges("tgi_batch_current_size", "tgi_queue_size")


def parse_llamacpp_slots(page: bytes) -> EngineLoad | None:
    """llama-server's `/slots`: a list with `is_processing` per slot. It shows no queue, so waiting
    is 0; it is the fallback for a server started without `--metrics` (then `/metrics` is an error)."""
    try:
        slots = json.loads(page)
    except ValueError:
        return None
    if not isinstance(slots, list) or not all(isinstance(s, dict) and "is_processing" in s for s in slots):
        return None
    return EngineLoad(running=sum(1 for s in slots if s["is_processing"] is True), waiting=0)


# --- the table ----------------------------------------------------------------------------------

def _rank(rank: int) -> int:
    # vLLM: lower `priority` is served earlier (ties by arrival), like a class rank.
    return rank


def _negated_rank(rank: int) -> int:
    # SGLang (--enable-priority-scheduling): a higher `priority` is served earlier unless the server
    # runs with --schedule-low-priority-values-first, so rank 0 must be the largest value.
    return -rank


KINDS: dict[str, Kind] = {
    "vllm": Kind(
        name="vllm", health_path="/health",
        load_sources=(LoadSource("/metrics", parse_vllm_metrics),),
        priority_field="priority", rank_to_priority=_rank, continues_generation=True,
        running_usage_options={"continuous_usage_stats": True}, continues_by_ids=True,
    ),
    "llamacpp": Kind(
        name="llamacpp", health_path="/health",  # 503 while the model loads, 200 once it serves
        load_sources=(LoadSource("/metrics", parse_llamacpp_metrics), LoadSource("/slots", parse_llamacpp_slots)),
        # llama-server closes the connection after a streamed response while advertising keep-alive;
        # a pooled connection reused right after one fails with "Server disconnected" or "Can not
        # write request body". Asking for a fresh connection per request avoids the stale reuse.
        upstream_headers={"Connection": "close"},
        continues_generation=True, one_token_per_chunk=True, head_with_first_token=True,
    ),
    "sglang": Kind(
        name="sglang", health_path="/health",
        load_sources=(LoadSource("/metrics", parse_sglang_metrics),),  # needs --enable-metrics
        priority_field="priority", rank_to_priority=_negated_rank,
    ),
    "tgi": Kind(
        name="tgi", health_path="/health",
        load_sources=(LoadSource("/metrics", parse_tgi_metrics),),
    ),
    "openai": Kind(name="openai", health_path="/v1/models"),
    # The simulator exports vLLM's metric names, so the gateway reads it exactly as it reads vLLM;
    # it has no priority queue of its own (the gateway's queue is the one under test).
    "sim": Kind(name="sim", health_path="/health", load_sources=(LoadSource("/metrics", parse_vllm_metrics),),
                # (the simulator sends a chunk per token, and copies vLLM's token ids)
                continues_generation=True, one_token_per_chunk=True, continues_by_ids=True),
}


# --- telling the kind from the server's own answers ---------------------------------------------

# Pages a backend of `kind: auto` is asked for, all at once; what each server answers on its own.
DETECT_PATHS = ("/version", "/props", "/info", "/get_server_info")


def _json_object(body: bytes | None) -> dict[str, Any] | None:
    if not body:
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def detect_kind(answers: Mapping[str, bytes | None]) -> str:
    """The kind of a server from the bodies of its 2xx answers to `DETECT_PATHS` (None: no 2xx
    answer). Each server is known by a page only it serves in that shape:
    the simulator's `/version` names itself; llama-server's `/props` has its slot settings; TGI's
    `/info` names its router and model; SGLang's `/get_server_info` lists its server args;
    vLLM's `/version` is `{"version": ...}` alone. Anything else is a plain `openai` server."""
    version = _json_object(answers.get("/version"))
    if version is not None and version.get("engine") == "tailguard-sim":
        return "sim"
    props = _json_object(answers.get("/props"))
    if props is not None and ("default_generation_settings" in props or "total_slots" in props):
        return "llamacpp"
    info = _json_object(answers.get("/info"))
    if info is not None and "model_id" in info and ("router" in info or "max_total_tokens" in info):
        return "tgi"
    server_info = _json_object(answers.get("/get_server_info"))
    if server_info is not None and ("model_path" in server_info or "tp_size" in server_info):
        return "sglang"
    if version is not None and isinstance(version.get("version"), str):
        return "vllm"
    return "openai"


def get_kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown backend kind {name!r} (known: {', '.join(KINDS)})") from None
