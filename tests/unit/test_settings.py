"""Dotted settings, digests and diffs on plain dicts."""

from __future__ import annotations

from tailguard.settings import Change, described, diff, digest, flatten

CFG = {"port": 8080, "scheduler": {"policy": "ranked-sjf", "aging_s": 10.0},
       "classes": [{"name": "interactive", "rank": 0}, {"name": "batch", "rank": 1, "max_tokens_cap": 4096}],
       "auth": {"api_keys": {}}, "tags": ["a", "b"]}


def test_named_lists_are_indexed_by_name_and_other_leaves_kept_whole() -> None:
    assert flatten(CFG) == {
        "port": 8080, "scheduler.policy": "ranked-sjf", "scheduler.aging_s": 10.0,
        "classes[interactive].rank": 0, "classes[batch].rank": 1, "classes[batch].max_tokens_cap": 4096,
        "auth.api_keys": {}, "tags": ["a", "b"],
    }


def test_a_diff_names_each_setting_in_the_yamls_own_words() -> None:
    new = {**CFG, "classes": [CFG["classes"][1] | {"max_tokens_cap": 2048}, CFG["classes"][0]],  # type: ignore[index, operator]
           "scheduler": {"policy": "fcfs", "aging_s": 10.0}}
    assert [str(c) for c in diff(flatten(CFG), flatten(new))] == [
        "classes[batch].max_tokens_cap: 4096 -> 2048", "scheduler.policy: ranked-sjf -> fcfs"]


def test_added_and_removed_settings_show_as_unset() -> None:
    assert diff({"a": 1}, {"b": None}) == [Change("a", 1, "(unset)"), Change("b", "(unset)", None)]
    assert str(Change("x", None, True)) == "x: null -> true"
    assert diff(flatten(CFG), flatten(CFG)) == []


def test_the_digest_ignores_key_order_but_not_values() -> None:
    reordered = dict(reversed(list(CFG.items())))
    assert digest(reordered) == digest(CFG) and len(digest(CFG)) == 12
    assert digest({**CFG, "port": 8081}) != digest(CFG)


def test_an_item_added_or_removed_whole_reads_as_one_line() -> None:
    old = flatten({"backends": [{"name": "a", "url": "http://h:1", "model": None}], "port": 1})
    new = flatten({"backends": [{"name": "a", "url": "http://h:2", "model": None},
                                {"name": "b", "url": "http://h:3", "max_concurrency": 4, "model": None}], "port": 2})
    assert described(old, new) == ["backends[a].url: http://h:1 -> http://h:2",
                                   "backends[b]: added (url http://h:3, max_concurrency 4)", "port: 1 -> 2"]
    assert described(new, old) == ["backends[a].url: http://h:2 -> http://h:1", "backends[b]: removed", "port: 2 -> 1"]


def test_a_key_added_or_removed_reads_as_one_line() -> None:
    old = flatten({"auth": {"api_keys": {}}, "port": 1})
    new = flatten({"auth": {"api_keys": {"fp1": {"name": "app", "default_class": "batch", "rpm_limit": None}}}, "port": 1})
    assert described(old, new) == ["auth.api_keys.fp1: added (name app, default_class batch)"]
    assert described(new, old) == ["auth.api_keys.fp1: removed"]
    assert described(flatten({"port": 1}), flatten({"port": 1, "otel": {"endpoint": "http://c:4317"}})) == [
        "otel: added (endpoint http://c:4317)"]


def test_an_item_named_for_its_address_stays_whole() -> None:
    """The quick form names a backend for its address: its dots are not the setting path's."""
    quick = flatten({"backends": [{"name": "127.0.0.1:8000", "url": "http://127.0.0.1:8000", "max_concurrency": 8}]})
    named = flatten({"backends": [{"name": "sim", "url": "http://127.0.0.1:8000", "max_concurrency": 8}]})
    assert described(quick, named) == ["backends[127.0.0.1:8000]: removed",
                                       "backends[sim]: added (url http://127.0.0.1:8000, max_concurrency 8)"]
