import dataclasses

import pytest

from tailguard.errors import ConfigError
from tailguard.sim.cost import PRESETS, CostModel, EngineConfig


def test_step_time_is_linear_in_each_term() -> None:
    c = CostModel(a_s=0.006, b_s_per_prefill_token=17e-6, c_s_per_decode_seq=5e-6, d_s_per_kv_token=0.075e-6)
    assert c.step_time(0, 0, 0) == pytest.approx(0.006)
    assert c.step_time(1000, 0, 0) == pytest.approx(0.006 + 0.017)
    assert c.step_time(0, 100, 0) == pytest.approx(0.006 + 0.0005)
    assert c.step_time(0, 0, 100_000) == pytest.approx(0.006 + 0.0075)


def test_presets_carry_the_documented_coefficients() -> None:
    h100 = PRESETS["h100-llama8b"].cost
    assert (h100.a_s, h100.b_s_per_prefill_token, h100.c_s_per_decode_seq, h100.d_s_per_kv_token) == (
        6e-3, 17e-6, 5e-6, 0.075e-6)
    a100 = PRESETS["a100-llama8b"].cost
    assert (a100.a_s, a100.b_s_per_prefill_token, a100.c_s_per_decode_seq, a100.d_s_per_kv_token) == (
        16e-3, 48e-6, 18e-6, 0.125e-6)
    assert PRESETS["h100-llama8b"].max_num_seqs == 256
    assert PRESETS["h100-llama8b"].max_num_batched_tokens == 8192
    assert "cpu-tiny" in PRESETS


def test_from_preset_overrides_field_by_field_and_ignores_unset_flags() -> None:
    cfg = EngineConfig.from_preset("h100-llama8b", max_num_seqs=8, scheduling_policy="priority", max_model_len=None)
    assert cfg.max_num_seqs == 8
    assert cfg.scheduling_policy == "priority"
    assert cfg.max_model_len == PRESETS["h100-llama8b"].max_model_len
    assert cfg.cost == PRESETS["h100-llama8b"].cost


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_preset("b200-llama405b")
    for name in PRESETS:
        assert name in str(e.value)


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(ConfigError, match="max_num_sequences"):
        EngineConfig.from_preset("cpu-tiny", max_num_sequences=4)


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": 4, "max_num_seqs": 8}, "max_num_batched_tokens"),
        ({"kv_cache_tokens": 1000, "max_model_len": 4096}, "kv_cache_tokens"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
        ({"output_length": "gaussian"}, "output_length"),
        ({"output_mean_ratio": 0.0}, "output_mean_ratio"),
        ({"cost": CostModel(0.0, 0.0, 0.0, 0.0)}, "cost"),
    ],
)
def test_invalid_limits_are_refused_like_vllm_refuses_them(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        dataclasses.replace(PRESETS["cpu-tiny"], **changes)  # type: ignore[arg-type]


def test_num_kv_blocks_counts_whole_blocks() -> None:
    cfg = EngineConfig.from_preset("cpu-tiny", kv_cache_tokens=4100, max_model_len=4096)
    assert cfg.num_kv_blocks == 256
