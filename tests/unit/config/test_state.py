"""`state:` (replicas sharing limits through Redis): what it accepts, and a password in its URL
never shown in the settings `/config` serves and a bench run records."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.errors import ConfigError
from tailguard.config import GatewayConfig, StateConfig
from tailguard.config.loading import load_config


def test_state_is_off_by_default_and_takes_a_redis_url() -> None:
    assert GatewayConfig().state.url is None
    cfg = StateConfig(url="redis://127.0.0.1:6379/0", on_unavailable="closed", replicas=3)
    assert (cfg.on_unavailable, cfg.replicas, cfg.lease_s) == ("closed", 3, 5.0)
    with pytest.raises(ValueError, match="redis://"):
        StateConfig(url="http://127.0.0.1:6379")
    with pytest.raises(ValueError):
        StateConfig(url="redis://x", on_unavailable="open")  # type: ignore[arg-type]


def test_a_password_in_the_url_is_fingerprinted_in_the_settings() -> None:
    cfg = GatewayConfig.model_validate({"state": {"url": "redis://app:s3cret-pw@10.0.0.9:6380/1"}})
    shown = cfg.settings()["state"]["url"]
    assert "s3cret-pw" not in shown and shown.startswith("redis://app:key:") and shown.endswith("@10.0.0.9:6380/1")
    other = GatewayConfig.model_validate({"state": {"url": "redis://app:other-pw@10.0.0.9:6380/1"}})
    assert other.digest() != cfg.digest()  # a changed password still shows as a change
    assert GatewayConfig.model_validate({"state": {"url": "redis://10.0.0.9"}}).settings()["state"]["url"] == \
        "redis://10.0.0.9"


def test_an_unknown_state_key_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("state:\n  url: redis://127.0.0.1:6379\n  lease: 3\n")
    with pytest.raises(ConfigError, match="lease"):
        load_config(path)
