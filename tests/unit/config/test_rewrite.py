"""A stored config written back into a person's YAML (`config.rewrite`): the settings change,
the comments, order and style stay. Pure: text in, text out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tailguard.config import load_config
from tailguard.config.rewrite import rewritten

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tailguard.yaml"


def stored(path: Path) -> dict[str, Any]:
    """What the state directory keeps of a config: the settings its file set."""
    return load_config(path).model_dump(mode="json", exclude_unset=True)


def test_the_example_with_its_own_settings_is_unchanged() -> None:
    text = EXAMPLE.read_text()
    assert rewritten(text, stored(EXAMPLE)) == text


def test_a_changed_setting_changes_one_line_and_every_comment_stays(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    settings = stored(EXAMPLE)
    settings["classes"][1]["max_tokens_cap"] = 2048
    settings["scheduler"]["aging_s"] = 5.0
    out = rewritten(text, settings)
    changed = [(a, b) for a, b in zip(text.splitlines(), out.splitlines()) if a != b]
    assert len(text.splitlines()) == len(out.splitlines()) and changed == [
        ("    max_tokens_cap: 4096       # larger max_tokens are lowered to 4096 ...",
         "    max_tokens_cap: 2048       # larger max_tokens are lowered to 4096 ..."),
        ("  aging_s: 10                  # nobody waits longer than this behind younger, shorter requests",
         "  aging_s: 5.0                 # nobody waits longer than this behind younger, shorter requests")]
    (tmp_path / "t.yaml").write_text(out)
    assert load_config(tmp_path / "t.yaml").model_dump(mode="json", exclude_unset=True) == settings


def test_a_key_the_stored_config_lacks_goes_and_the_notes_below_it_stay() -> None:
    text = "host: 127.0.0.1\nport: 9000    # ours\n\n# the engines\nbackends: [{name: a, url: 'http://x'}]\n"
    out = rewritten(text, {"host": "127.0.0.1", "backends": [{"name": "a", "url": "http://x"}]})
    assert out == "host: 127.0.0.1\n\n# the engines\nbackends: [{name: a, url: 'http://x'}]\n"


def test_named_entries_are_matched_by_name_and_keep_their_comments() -> None:
    text = ("backends:\n"
            "  - name: a   # the old box\n"
            "    url: http://a\n"
            "  - name: b   # the new box\n"
            "    url: http://b\n")
    out = rewritten(text, {"backends": [{"name": "b", "url": "http://b"}, {"name": "c", "url": "http://c"}]})
    assert out == ("backends:\n"
                   "  - name: b   # the new box\n"
                   "    url: http://b\n"
                   "  - name: c\n"
                   "    url: http://c\n")


@pytest.mark.parametrize("have,want,same", [("10", 10.0, True), ("true", 1, False), ("'x'", "x", True)])
def test_a_value_equal_as_a_setting_is_left_as_written(have: str, want: Any, same: bool) -> None:
    out = rewritten(f"v: {have}   # note\n", {"v": want})
    assert (out == f"v: {have}   # note\n") is same
    assert yaml.safe_load(out)["v"] == want and "# note" in out


def test_a_file_it_cannot_read_round_trip_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="ruamel.yaml cannot read it"):
        rewritten("port: 1\nport: 2\n", {"port": 2})
