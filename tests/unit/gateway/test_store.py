"""The state directory: configs stored by content and numbered, the history, the baseline, the
hand-over files; and which changes a live reload refuses. Files in a temporary directory only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tailguard.errors import ConfigError
from tailguard.config import AdaptiveConfig, GatewayConfig
from tailguard.gateway.ops.reload import restart_needed
from tailguard.gateway.ops.store import ConfigStore, default_state_dir


def cfg(**update: object) -> GatewayConfig:
    base = GatewayConfig.model_validate({"backends": [{"name": "a", "url": "http://127.0.0.1:9", "api_key": "sk-1"}],
                                         "auth": {"api_keys": {"client-secret": {"name": "app"}}}})
    return base.model_copy(update=update)


def test_configs_are_numbered_by_content_and_every_application_is_in_the_history(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "state")
    first = store.record(cfg(), "start")
    second = store.record(cfg(port=9000), "reload")
    again = store.record(cfg(), "rollback to 1")
    assert (first.n, second.n, again) == (1, 2, first)
    assert [e.n for e in store.entries()] == [1, 2] and first.path.name == f"0001-{first.hash}.yaml"
    assert [(a.n, a.how) for a in store.history()] == [(1, "start"), (2, "reload"), (1, "rollback to 1")]
    assert store.current() == first
    assert store.get(2).load().digest() == second.hash  # a stored file loads back to the same config
    assert oct(first.path.stat().st_mode & 0o777) == "0o600"  # it holds the keys


def test_the_baseline_is_marked_by_number(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path)
    assert store.good() is None
    store.record(cfg(), "start")
    assert store.mark_good(1) == store.good()
    with pytest.raises(ConfigError, match=r"no config 7 .*stored: 1"):
        store.mark_good(7)


def test_the_hand_over_files_are_read_once_and_the_pid_file_is_ours(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path)
    with pytest.raises(ConfigError, match="no running gateway"):
        store.running_pid()
    store.write_pid()
    assert store.pid_file.read_text() == f"{os.getpid()}\n"
    store.write_json(store.request_file, {"id": "x", "n": 1})
    assert store.take_json(store.request_file) == {"id": "x", "n": 1}
    assert store.take_json(store.request_file) is None
    store.clear_pid()
    assert not store.pid_file.exists()


def test_one_gateway_claims_a_directory_until_it_lets_go(tmp_path: Path) -> None:
    first, second = ConfigStore(tmp_path), ConfigStore(tmp_path)
    first.claim()
    first.claim()  # again: it holds it already
    with pytest.raises(ConfigError, match=r"a gateway \(another process\) already serves .* --state-dir DIR"):
        second.claim()
    first.release()
    second.claim()
    second.release()


def test_a_live_pid_of_a_gateway_that_took_no_lock_is_refused_too(tmp_path: Path) -> None:
    """A gateway of an older release writes its pid but takes no lock: its pid alone refuses."""
    older = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()", "tailguard"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert older.stdout is not None and older.stdout.readline() == b"up\n"  # its own command line by now
        (tmp_path / "gateway.pid").write_text(f"{older.pid}\n")
        with pytest.raises(ConfigError, match=rf"a gateway \(pid {older.pid}\) already serves"):
            ConfigStore(tmp_path).claim()
    finally:
        older.communicate(b"", timeout=10)  # its stdin closed: it ends
    ConfigStore(tmp_path).claim()  # its pid is dead now


def test_the_default_state_is_beside_the_config_one_per_file(tmp_path: Path) -> None:
    assert default_state_dir(tmp_path / "prod.yaml") == tmp_path.resolve() / ".tailguard" / "prod"


def test_secrets_are_fingerprints_in_the_settings_yet_a_new_key_changes_the_hash() -> None:
    s = cfg().settings()
    assert "client-secret" not in str(s) and "sk-1" not in str(s)
    rotated = cfg(backends=[cfg().backends[0].model_copy(update={"api_key": "sk-2"})])
    assert rotated.digest() != cfg().digest()


def test_a_reload_refuses_what_only_a_start_reads_and_takes_the_rest() -> None:
    moved = cfg(backends=[cfg().backends[0].model_copy(update={"url": "http://127.0.0.1:10", "max_concurrency": 4,
                                                                "api_key": "sk-2", "model": "m2"})])
    assert restart_needed(cfg(), moved) == []  # the next attempt and probe go to the new address
    learning = cfg(backends=[cfg().backends[0].model_copy(update={"adaptive": AdaptiveConfig(min=2, max=32)})])
    assert restart_needed(cfg(), learning) == [] and restart_needed(learning, cfg()) == []  # the front swaps its cap
    retyped = cfg(backends=[cfg().backends[0].model_copy(update={"kind": "vllm"})])
    assert [c.name for c in restart_needed(cfg(), retyped)] == ["backends[a].kind"]
    assert [c.name for c in restart_needed(cfg(), cfg(port=1))] == ["port"]
    tuned = cfg(scheduler=cfg().scheduler.model_copy(update={"aging_s": 2.0}), body_timeout_s=5.0,
                timeouts=cfg().timeouts.model_copy(update={"connect_s": 1.0, "first_token_s": 9.0}),
                health=cfg().health.model_copy(update={"path": "/ready", "interval_s": 0.5, "unhealthy_after": 2}))
    assert restart_needed(cfg(), tuned) == []  # deadlines and probes reach new requests and probes


def test_a_stale_pid_of_another_program_is_not_signalled(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path)
    store.write_pid()
    store.pid_file.write_text("1\n")  # init: alive, and not a tailguard gateway
    with pytest.raises(ConfigError, match="another program"):
        store.running_pid()
