"""Gateway config: defaults, validation, and error messages a person can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.errors import ConfigError
from tailguard.config import GatewayConfig, load_config
from tailguard.config.loading import names_key_file

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tailguard.yaml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "tailguard.yaml"
    p.write_text(text)
    return p


def test_defaults_have_interactive_first_and_a_capped_batch_class() -> None:
    cfg = GatewayConfig()
    assert [(c.name, c.rank) for c in cfg.classes] == [("interactive", 0), ("batch", 1), ("embeddings", 2)]
    batch = cfg.classes[1]
    pooling = cfg.classes[2]  # the pooling routes' class: half the slots at most, a quarter of those in use for sure
    assert (pooling.max_share, pooling.min_share, pooling.preemptible, cfg.pooling_class) == (0.5, 0.25, False,
                                                                                             "embeddings")
    assert cfg.intake_params().route_classes["embeddings"] == "embeddings"
    assert GatewayConfig(classes=cfg.classes[:2]).intake_params().route_classes == {}
    assert batch.max_tokens_cap == 4096 and batch.cap_mode == "clamp"
    assert (batch.max_share, batch.min_share, batch.preemptible) == (1.0, 0.0, True)
    assert not cfg.classes[0].preemptible and cfg.scheduler.preemption
    assert cfg.default_class == "interactive"
    assert (cfg.host, cfg.port, cfg.max_body_bytes) == ("127.0.0.1", 8080, 4 * 1024 * 1024)
    assert cfg.scheduler.policy == "ranked-sjf" and cfg.backends == []
    assert cfg.access_log is True and cfg.log_prompts is False and cfg.retries.max_attempts == 3


def test_every_field_is_documented() -> None:
    from pydantic import BaseModel

    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            for arg in (ann, *getattr(ann, "__args__", ())):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    walk(arg)

    walk(GatewayConfig)
    assert len(seen) >= 8


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == GatewayConfig()


def test_example_file_is_valid() -> None:
    cfg = load_config(EXAMPLE)
    assert [b.name for b in cfg.backends] and cfg.classes


def test_full_file_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, """
port: 9000
classes:
  - {name: chat, rank: 0, max_queue_wait_s: 5}
  - {name: bulk, rank: 2, max_tokens_cap: 1000, cap_mode: reject, max_share: 0.5}
default_class: chat
service_tier_map: {flex: bulk}
backends:
  - {name: gpu-a, url: "http://127.0.0.1:8000/v1/", kind: vllm, max_concurrency: 16}
auth:
  api_keys:
    sk-1: {name: reports, default_class: bulk}
scheduler: {policy: fcfs, aging_s: 3}
"""))
    assert cfg.port == 9000 and cfg.default_class == "chat"
    assert cfg.backends[0].url == "http://127.0.0.1:8000"  # trailing /v1/ removed
    assert cfg.backends[0].kind == "vllm" and cfg.scheduler.policy == "fcfs"
    assert cfg.auth.api_keys["sk-1"].default_class == "bulk"


@pytest.mark.parametrize("text,expected", [
    ("classes:\n  - {name: a}\n  - {name: a}\ndefault_class: a\n", "class name 'a' appears more than once"),
    ("default_class: gold\n", "default_class 'gold' is not a configured class (known: interactive, batch, embeddings)"),
    ("backends:\n  - {name: x, url: 'http://h:1'}\n  - {name: x, url: 'http://h:2'}\n",
     "backend name 'x' appears more than once"),
    ("classes:\n  - {name: interactive, max_share: 0}\n", "classes[0] (interactive).max_share: Input should be greater than 0"),
    ("classes:\n  - {name: interactive, max_share: 1.5}\n", "classes[0] (interactive).max_share: Input should be less than or equal to 1"),
    ("backends:\n  - {name: a, url: 'http://h:1', max_concurrency: 0}\n",
     "backends[0] (a).max_concurrency: Input should be greater than or equal to 1"),
    ("backends:\n  - {name: a, url: 'ftp://h'}\n", "must start with http:// or https://"),
    ("backends:\n  - {name: a, url: 'http://h:1', kind: triton}\n",
     "backends[0] (a).kind: Input should be 'auto', 'vllm', 'llamacpp', 'sglang', 'tgi', 'openai' or 'sim'"),
    ("prot: 80\n", "prot: unknown setting (did you mean port? see docs/configuration.md)"),
    ("colour: blue\n", "colour: unknown setting (check the spelling; see docs/configuration.md)"),
    ("scheduler: {agin_s: 5}\n", "scheduler.agin_s: unknown setting (did you mean aging_s?"),
    ("classes:\n  - {name: interactive, max_queue_wait: 10}\n",
     "classes[0] (interactive).max_queue_wait: unknown setting (did you mean max_queue_wait_s?"),
    ("auth: {api_keys: {sk-app-1: {name: web-app, rpm_limt: 600}}}\n",
     " (web-app).rpm_limt: unknown setting (did you mean rpm_limit?"),
    ("timeouts: {idle_s: -1}\n", "timeouts.idle_s: Input should be greater than 0"),
    ("classes:\n  - {name: interactive, default_max_tokens: 500, max_tokens_cap: 100}\n",
     "default_max_tokens (500) is above max_tokens_cap (100)"),
    ("classes:\n  - {name: 'my class'}\n", "may only hold letters"),
    ("service_tier_map: {flex: gold}\n", "service_tier_map.flex names unknown class 'gold'"),
    ("service_tier_map: {turbo: batch}\n", "service_tier_map.turbo (as a key): Input should be 'auto', 'default', 'flex', 'scale' or 'priority'"),
    ("auth: {api_keys: {k: {name: ops, default_class: gold}}}\n", "ops has default_class 'gold'"),
    ("classes: []\n", "classes: List should have at least 1 item"),
    ("classes:\n  - {name: interactive, max_share: 0.5, min_share: 0.75}\n", "min_share (0.75) is above max_share (0.5)"),
    ("classes:\n  - {name: interactive, min_share: 1}\n", "classes[0] (interactive).min_share: Input should be less than 1"),
    ("classes:\n  - {name: interactive, min_share: -0.1}\n", "min_share: Input should be greater than or equal to 0"),
    ("scheduler: {sjf_size_ratio: 0.5}\n", "scheduler.sjf_size_ratio: Input should be greater than or equal to 1"),
    ("auth: {api_keys: {k1: {name: ops, rpm_limit: 10}, k2: {name: ops, rpm_limit: 20}}}\n",
     "keys named 'ops' share their limits, so they must give the same rpm_limit, tpm_limit, max_parallel_requests and weight"),
    ("auth: {api_keys: {k: {tpm_limit: 0}}}\n", "tpm_limit: Input should be greater than or equal to 1"),
])
def test_invalid_files_name_the_field_and_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ")
    assert expected in msg


def test_yaml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "port: 80\nclasses: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 3, column 1"):
        load_config(path)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping of settings, got list"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_quick_form_names_backends_by_host_and_port() -> None:
    cfg = GatewayConfig.quick(["http://127.0.0.1:8100/v1", "http://127.0.0.1:8100", "http://127.0.0.1:8101"], 4)
    assert [b.name for b in cfg.backends] == ["127.0.0.1:8100", "127.0.0.1:8100-1", "127.0.0.1:8101"]
    assert all(b.max_concurrency == 4 and b.url.startswith("http://127.0.0.1:81") for b in cfg.backends)
    assert [c.name for c in cfg.classes] == ["interactive", "batch", "embeddings"]
    with pytest.raises(ConfigError, match="at least one --backend"):
        GatewayConfig.quick([], 8)
    with pytest.raises(ConfigError, match=r"(?s)--backend: .*must start with http://"):
        GatewayConfig.quick(["127.0.0.1:8100"], 8)


def test_quick_form_backend_kind() -> None:
    assert [b.kind for b in GatewayConfig.quick(["http://127.0.0.1:8100"], 8).backends] == ["auto"]
    assert [b.kind for b in GatewayConfig.quick(["http://127.0.0.1:8100"], 8, "vllm").backends] == ["vllm"]
    with pytest.raises(ConfigError, match="kind"):
        GatewayConfig.quick(["http://127.0.0.1:8100"], 8, "nginx")


def test_docs_describe_every_field() -> None:
    from pydantic import BaseModel

    from tailguard import config as mod

    docs = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    models = [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__.startswith(mod.__name__)]
    missing = [f"{m.__name__}.{n}" for m in models for n in m.model_fields if f"`{n}`" not in docs and f".{n}`" not in docs]
    assert not missing, f"docs/configuration.md does not mention {missing}"


def test_keys_are_callers_by_name_and_limits_go_to_the_front_once_per_caller() -> None:
    cfg = GatewayConfig.model_validate({"auth": {"api_keys": {
        "sk-1": {"name": "reports", "tpm_limit": 1000}, "sk-2": {"name": "reports", "tpm_limit": 1000},
        "sk-3": {"rpm_limit": 5}, "sk-4": {"name": "free"}}}})
    callers = {c.name: (c.requests_per_minute, c.tokens_per_minute) for c in cfg.front_params().callers}
    fingerprint = cfg.auth.api_keys["sk-3"].caller("sk-3")
    assert callers == {"reports": (None, 1000), fingerprint: (5, None)} and fingerprint.startswith("key:")


def test_fair_share_settings_reach_the_front_and_null_turns_its_preemption_off() -> None:
    queue = GatewayConfig.model_validate({"scheduler": {"fair_share": True}}).front_params().queue
    assert queue.fair_share and queue.fair_credit == 8192.0 and queue.fair_preempt_gap == 0.0
    queue = GatewayConfig.model_validate({"scheduler": {"fair_share": True, "fair_credit": 0,
                                                        "fair_preempt_gap": None}}).front_params().queue
    assert queue.fair_credit == 0.0 and queue.fair_preempt_gap is None
    with pytest.raises(Exception, match="fair_preempt_gap"):
        GatewayConfig.model_validate({"scheduler": {"fair_preempt_gap": -1}})


KEY_FILE_CONFIG = ("backends: [{name: b, url: 'http://127.0.0.1:1'}]\n"
                   "auth: {api_keys: {sk-inline-0123456789: {name: inline}}, api_keys_file: keys/secret.yaml}\n")


def test_keys_from_a_key_file_join_the_configs_relative_to_its_folder(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "secret.yaml").write_text(
        "sk-from-file-0123456789: {name: team-a, rpm_limit: 60}\nsk-bare-0123456789:\n")
    cfg = load_config(write(tmp_path, KEY_FILE_CONFIG))
    assert {k: v.name for k, v in cfg.auth.api_keys.items()} == {
        "sk-inline-0123456789": "inline", "sk-from-file-0123456789": "team-a", "sk-bare-0123456789": None}
    assert cfg.auth.api_keys["sk-from-file-0123456789"].rpm_limit == 60
    assert names_key_file(tmp_path / "tailguard.yaml")
    assert "api_keys_file" not in cfg.model_dump(mode="json", exclude_unset=True)["auth"]  # the keys are recorded


@pytest.mark.parametrize("content, problem", [
    (None, "cannot read key file"),
    ("- sk-in-a-list-0123456789\n", "top level must be a mapping"),
    ("sk-inline-0123456789: {name: other}\n", "also in the config's auth.api_keys"),
    ("sk-from-file-0123456789: {rpm_limit: -1}\n", "rpm_limit"),
])
def test_a_bad_key_file_is_a_config_error_that_names_no_key(tmp_path: Path, content: str | None, problem: str) -> None:
    if content is not None:
        (tmp_path / "keys").mkdir()
        (tmp_path / "keys" / "secret.yaml").write_text(content)
    with pytest.raises(ConfigError, match=problem) as e:
        load_config(write(tmp_path, KEY_FILE_CONFIG))
    assert "sk-inline-0123456789" not in str(e.value) and "sk-from-file" not in str(e.value)


def test_the_ttft_targets_the_alerts_read_are_the_classes_own() -> None:
    from tailguard.config import GatewayConfig

    assert GatewayConfig().ttft_targets() == {"interactive": 2.0}
    cfg = GatewayConfig.model_validate({"classes": [{"name": "chat", "slo": {"ttft_s": 1.0, "e2e_s": 30}},
                                                    {"name": "batch", "rank": 1, "slo": {"e2e_s": 3600}},
                                                    {"name": "bulk", "rank": 2}], "default_class": "chat"})
    assert cfg.ttft_targets() == {"chat": 1.0}


@pytest.mark.parametrize("keys,scheduler,on", [
    ({"sk-a": {"name": "a"}, "sk-b": {"name": "b"}}, {}, True),  # two callers: on by default
    ({"sk-a": {"name": "a"}, "sk-a2": {"name": "a"}}, {}, False),  # two keys, one caller
    ({"sk-a": {"name": "a"}}, {}, False),
    ({}, {}, False),  # no keys: one caller, everyone
    ({"sk-a": {"name": "a"}, "sk-b": {"name": "b"}}, {"fair_share": False}, False),  # turned off
    ({"sk-a": {"name": "a"}, "sk-b": {"name": "b"}}, {"policy": "fcfs"}, False),  # fcfs has no share to keep
    ({"sk-a": {"name": "a"}}, {"fair_share": True}, True),
])
def test_fair_share_is_on_by_default_once_two_callers_are_named(keys: dict, scheduler: dict, on: bool) -> None:
    cfg = GatewayConfig.model_validate({"backends": [{"name": "a", "url": "http://127.0.0.1:9"}],
                                        "auth": {"api_keys": keys}, "scheduler": scheduler})
    assert cfg.front_params().queue.fair_share is on and cfg.fair_share() is on
