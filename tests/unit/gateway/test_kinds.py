"""Backend kinds: load pages parsed from literal text captured from the real servers."""

from __future__ import annotations

import pytest

from tailguard.gateway.upstream.kinds import (
    KINDS, EngineLoad, detect_kind, get_kind, parse_llamacpp_metrics, parse_llamacpp_slots, parse_sglang_metrics,
    parse_tgi_metrics, parse_vllm_metrics, prometheus_sums,
)

VLLM_PAGE = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 8.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.02
"""
LLAMACPP_PAGE = b"""# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
llamacpp:n_busy_slots_per_decode 4
"""
SLOTS_PAGE = (b'[{"id":0,"n_ctx":2048,"speculative":false,"is_processing":true},'
              b'{"id":1,"n_ctx":2048,"speculative":false,"is_processing":false},'
              b'{"id":2,"n_ctx":2048,"speculative":false,"is_processing":true,"id_task":7}]')


def test_vllm_page_sums_only_the_exact_names() -> None:
    # `vllm:num_requests_waiting_by_reason` shares a prefix and must not be added in.
    assert parse_vllm_metrics(VLLM_PAGE) == EngineLoad(running=8, waiting=3)


def test_series_of_several_ranks_are_summed() -> None:
    page = b'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 5\n'
    assert parse_vllm_metrics(page) == EngineLoad(running=7, waiting=0)


def test_llamacpp_metrics_and_slots() -> None:
    assert parse_llamacpp_metrics(LLAMACPP_PAGE) == EngineLoad(running=4, waiting=2)
    assert parse_llamacpp_slots(SLOTS_PAGE) == EngineLoad(running=2, waiting=0)


def test_sglang_and_tgi_names() -> None:
    sglang = b'sglang:num_running_reqs{model_name="m"} 8\nsglang:num_queue_reqs{model_name="m"} 4\n'
    tgi = b"# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 6\ntgi_queue_size 1\n"
    assert parse_sglang_metrics(sglang) == EngineLoad(8, 4)
    assert parse_tgi_metrics(tgi) == EngineLoad(6, 1)


@pytest.mark.parametrize("page", [
    b"", b"not metrics at all", b'{"error": {"code": 501, "message": "metrics disabled"}}',
    LLAMACPP_PAGE,  # another server's page: not understood, rather than read as idle
])
def test_a_page_without_the_running_gauge_is_not_understood(page: bytes) -> None:
    assert parse_vllm_metrics(page) is None


@pytest.mark.parametrize("page", [b"", b"{}", b"[1, 2]", b'[{"id": 0}]', b"<html>"])
def test_slots_page_must_be_a_list_of_slots(page: bytes) -> None:
    assert parse_llamacpp_slots(page) is None


def test_prometheus_sums_skip_comments_timestamps_and_bad_values() -> None:
    page = b"# a comment with llamacpp:requests_processing 99\nx 1 1700000000\ny NaN\ny 2\nz{a=\"}\" 1\n"
    assert prometheus_sums(page, ["x", "y", "llamacpp:requests_processing"]) == {"x": 1.0, "y": 2.0}


def test_priority_mapping_per_kind() -> None:
    assert get_kind("vllm").priority_for(0) == ("priority", 0)
    assert get_kind("vllm").priority_for(2) == ("priority", 2)  # lower runs earlier
    assert get_kind("sglang").priority_for(2) == ("priority", -2)  # higher runs earlier
    for name in ("llamacpp", "tgi", "openai", "sim"):
        assert get_kind(name).priority_for(1) is None


def test_quirks_and_health_paths() -> None:
    assert get_kind("llamacpp").upstream_headers == {"Connection": "close"}
    assert get_kind("openai").health_path == "/v1/models"
    assert [s.path for s in get_kind("llamacpp").load_sources] == ["/metrics", "/slots"]
    assert get_kind("openai").load_sources == ()


def test_token_counting_per_kind() -> None:
    # Chunks count tokens only where the server sends one token per chunk; vLLM is told to put the
    # running usage on every chunk instead (tests/real/test_preemption_real.py shows why).
    assert get_kind("llamacpp").one_token_per_chunk and get_kind("sim").one_token_per_chunk
    assert not get_kind("vllm").one_token_per_chunk
    assert get_kind("vllm").running_usage_options == {"continuous_usage_stats": True}


def test_every_configurable_kind_is_in_the_table() -> None:
    from typing import get_args

    from tailguard.config import BackendKind

    assert set(get_args(BackendKind)) - {"auto"} == set(KINDS)  # auto: one of these, found by asking


def test_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: vllm, llamacpp"):
        get_kind("triton")


def engine_doc_configs() -> dict[str, str]:
    """The YAML blocks of docs/engines.md, by the backend kind each one configures."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "engines.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return {re.search(r"kind: (\w+)", b).group(1): b for b in blocks}  # type: ignore[union-attr]


def test_every_config_in_the_engines_doc_loads(tmp_path: pytest.TempPathFactory) -> None:
    from pathlib import Path

    from tailguard.config import load_config

    configs = engine_doc_configs()
    assert set(configs) == {"vllm", "llamacpp", "sglang", "tgi", "openai"}
    for kind, block in configs.items():
        path = Path(str(tmp_path)) / f"{kind}.yaml"
        path.write_text(block)
        cfg = load_config(path)
        assert [b.kind for b in cfg.backends] == [kind]


# What each server answers on the pages `kind: auto` asks for (shapes from their own servers).
VLLM_VERSION = b'{"version":"0.10.1.1"}'
SIM_VERSION = b'{"version":"0.1.0","engine":"tailguard-sim"}'
LLAMACPP_PROPS = (b'{"default_generation_settings":{"n_ctx":2048,"params":{}},"total_slots":4,'
                  b'"model_path":"tiny.gguf","chat_template":"","build_info":"b6000"}')
TGI_INFO = (b'{"model_id":"tiny","model_dtype":"torch.float16","max_total_tokens":2048,'
            b'"router":"text-generation-router","version":"3.3.4"}')
SGLANG_INFO = b'{"model_path":"tiny","tokenizer_path":"tiny","tp_size":1,"version":"0.4.9"}'


@pytest.mark.parametrize("answers,kind", [
    ({"/version": VLLM_VERSION}, "vllm"),
    ({"/version": SIM_VERSION}, "sim"),
    ({"/props": LLAMACPP_PROPS}, "llamacpp"),
    ({"/info": TGI_INFO}, "tgi"),
    ({"/get_server_info": SGLANG_INFO, "/version": b'{"version":"0.4.9"}'}, "sglang"),
    ({}, "openai"),
    ({"/version": b"<html>not json</html>", "/props": b"[1]", "/info": b'{"model_id":"x"}'}, "openai"),
])
def test_the_kind_is_read_from_the_page_only_that_server_serves(answers: dict[str, bytes], kind: str) -> None:
    assert detect_kind(answers) == kind
    assert kind in KINDS
