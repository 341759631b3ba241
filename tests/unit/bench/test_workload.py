"""Workload model, built-ins, seeded request stream and arrival schedules; no sockets."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import orjson
import pytest

from tailguard.bench.stream import RequestFactory, arrival_gaps, schedule
from tailguard.bench.workload import BUILTIN_WORKLOADS, load_workload, parse_workload, workload_yaml
from tailguard.errors import ConfigError
from tailguard.wire.openai import parse_request


def stream(name_or_data: str | dict, seed: int = 0, n: int = 200) -> list:
    w = load_workload(name_or_data)[0] if isinstance(name_or_data, str) else parse_workload(name_or_data)
    f = RequestFactory(w, seed=seed, model="m")
    return [f.next() for _ in range(n)]


def test_builtins_validate_and_round_trip_through_yaml() -> None:
    import yaml

    for name in BUILTIN_WORKLOADS:
        w, base = load_workload(name)
        assert base is None and w.name == name
        assert parse_workload(yaml.safe_load(workload_yaml(w))) == w
        assert all(c.stream for c in w.classes)


def test_seed_mixed_is_the_seed_service() -> None:
    w, _ = load_workload("seed-mixed")
    c = {x.name: x for x in w.classes}
    assert c["chat"].max_tokens.sample(random.Random()) == 32  # type: ignore[union-attr]
    assert c["summary"].max_tokens.sample(random.Random()) == 2048  # type: ignore[union-attr]
    assert c["chat"].headers == {"X-Tailguard-Class": "interactive"}
    assert c["summary"].headers == {"X-Tailguard-Class": "batch"}
    assert c["chat"].weight > c["summary"].weight  # mostly chat


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    a, b, other = stream("seed-mixed", 5), stream("seed-mixed", 5), stream("seed-mixed", 6)
    assert a == b
    assert [r.body for r in a] != [r.body for r in other]


def test_class_mix_follows_weights() -> None:
    reqs = stream("long-prefill", n=4000)
    share = sum(r.cls == "long" for r in reqs) / len(reqs)
    assert share == pytest.approx(0.2, abs=0.03)


@pytest.mark.parametrize("name", sorted(BUILTIN_WORKLOADS))
def test_prompt_tokens_are_exact_as_the_server_counts_them(name: str) -> None:
    for r in stream(name, n=60):
        parsed = parse_request(r.body, "chat")
        assert parsed.prompt_tokens == r.prompt_tokens
        assert parsed.max_tokens == r.max_tokens
        assert parsed.stream and parsed.include_usage and parsed.model == "m"
    if name == "long-prefill":
        assert {r.prompt_tokens for r in stream(name, n=60) if r.cls == "long"} == {8000}


def test_system_prompt_shared_or_fresh_and_completions_endpoint() -> None:
    data = {"name": "x", "classes": [
        {"name": "shared", "prompt_tokens": {"dist": "uniform", "low": 300, "high": 400}, "max_tokens": 5,
         "system_prompt": {"tokens": 200, "shared": True}},
        {"name": "fresh", "prompt_tokens": 350, "max_tokens": 5, "system_prompt": {"tokens": 200, "shared": False},
         "stream": False, "body": {"service_tier": "flex", "priority": 3}, "ignore_eos": True},
    ]}
    reqs = stream(data, n=40)
    systems = {cls: {orjson.loads(r.body)["messages"][0]["content"] for r in reqs if r.cls == cls} for cls in ("shared", "fresh")}
    assert len(systems["shared"]) == 1 and len(systems["fresh"]) > 5
    for r in reqs:
        assert parse_request(r.body, "chat").prompt_tokens == r.prompt_tokens
        body = orjson.loads(r.body)
        if r.cls == "fresh":
            assert body["service_tier"] == "flex" and body["priority"] == 3 and body["ignore_eos"] is True
            assert body["stream"] is False and "stream_options" not in body
    comp = stream({"name": "c", "endpoint": "completions", "classes": [{"name": "a", "prompt_tokens": 77,
                   "system_prompt": {"tokens": 20}}]}, n=5)
    for r in comp:
        assert r.path == "/v1/completions"
        assert parse_request(r.body, "completions").prompt_tokens == r.prompt_tokens == 77


def test_unshared_prompts_differ_from_their_first_token() -> None:
    firsts = {orjson.loads(r.body)["messages"][0]["content"][:64] for r in stream("chat-only", n=50)}
    assert len(firsts) == 50


@pytest.mark.parametrize("dist,check", [
    ({"dist": "uniform", "low": 10, "high": 20}, lambda xs: min(xs) >= 10 and max(xs) <= 20),
    ({"dist": "normal", "mean": 500, "std": 50}, lambda xs: abs(statistics.mean(xs) - 500) < 10),
    ({"dist": "lognormal", "median": 300, "sigma": 0.8}, lambda xs: abs(statistics.median(xs) - 300) < 25),
    ({"dist": "lognormal", "median": 300, "sigma": 2.0, "min": 50, "max": 1000}, lambda xs: min(xs) >= 50 and max(xs) <= 1000),
])
def test_length_distributions(dist: dict, check: object) -> None:
    reqs = stream({"name": "d", "classes": [{"name": "a", "prompt_tokens": dist, "max_tokens": dist}]}, n=2000)
    assert check([r.max_tokens for r in reqs])  # type: ignore[operator]
    assert check([r.prompt_tokens for r in reqs])  # type: ignore[operator]


def test_bad_workloads_are_clear_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="built-ins are"):
        load_workload("no-such-workload")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\nclasses:\n  - name: a\n    prompt_tokens: {dist: uniform, low: 9, high: 3}\n")
    with pytest.raises(ConfigError, match="classes.0.prompt_tokens"):
        load_workload(bad)
    bad.write_text("name: b\nclasses:\n  - name: a\n  - name: a\n")
    with pytest.raises(ConfigError, match="unique"):
        load_workload(bad)
    bad.write_text("name: b\nclasses:\n  - name: a\n    max_tokns: 3\n")
    with pytest.raises(ConfigError, match="max_tokns"):
        load_workload(bad)


def test_yaml_file_with_openai_and_sharegpt_datasets(tmp_path: Path) -> None:
    (tmp_path / "reqs.jsonl").write_bytes(b"\n".join([
        orjson.dumps({"model": "x", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7}),
        orjson.dumps({"model": "x", "prompt": "complete this", "max_tokens": 9}),
    ]))
    (tmp_path / "sg.json").write_bytes(orjson.dumps([
        {"conversations": [{"from": "human", "value": "q" * 40}, {"from": "gpt", "value": "a" * 80}]},
        {"conversations": [{"from": "gpt", "value": "no human turn"}]},
    ]))
    (tmp_path / "w.yaml").write_text(
        "classes:\n"
        "  - name: replay\n    source: {path: reqs.jsonl, format: openai, order: sequential}\n"
        "  - name: sg\n    source: {path: sg.json, format: sharegpt}\n"
    )
    w, base = load_workload(tmp_path / "w.yaml")
    assert w.name == "w" and base == tmp_path
    f = RequestFactory(w, seed=1, model="m", base_dir=base)
    replay = [f.make(i, "replay") for i in range(3)]
    assert [r.path for r in replay] == ["/v1/chat/completions", "/v1/completions", "/v1/chat/completions"]
    assert [r.max_tokens for r in replay] == [7, 9, 7]
    for r in replay:
        assert parse_request(r.body, "chat" if r.path.endswith("chat/completions") else "completions").prompt_tokens == r.prompt_tokens
    sg = f.make(3, "sg")
    assert sg.max_tokens == 20 and sg.prompt_tokens == 4 + 10
    (tmp_path / "broken.jsonl").write_text('{"messages": "nope"}\n')
    (tmp_path / "w2.yaml").write_text("classes:\n  - name: a\n    source: {path: broken.jsonl}\n")
    w2, base2 = load_workload(tmp_path / "w2.yaml")
    with pytest.raises(ConfigError, match="broken.jsonl:1"):
        RequestFactory(w2, base_dir=base2)


def test_constant_poisson_and_gamma_gaps() -> None:
    assert list(itertools.islice(arrival_gaps(4.0, "constant", 1.0, random.Random(0)), 3)) == [0.25] * 3
    for process, shape, cv in (("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5)):
        gaps = list(itertools.islice(arrival_gaps(10.0, process, shape, random.Random(1)), 40_000))  # type: ignore[arg-type]
        mean = statistics.fmean(gaps)
        assert mean == pytest.approx(0.1, rel=0.03)
        assert statistics.pstdev(gaps) / mean == pytest.approx(cv, rel=0.06)


def test_schedule_merges_own_arrival_processes_in_time_order() -> None:
    w = parse_workload({"name": "m", "classes": [
        {"name": "a", "weight": 1.0}, {"name": "nightly", "arrival": {"rate": 2.0, "process": "constant"}},
    ]})
    f = RequestFactory(w, seed=0)
    sched = list(itertools.takewhile(lambda x: x[0] < 100.0, schedule(f, rate=8.0, process="poisson", seed=0)))
    dues = [d for d, _ in sched]
    assert dues == sorted(dues) and dues[0] == 0.0
    nightly = [d for d, c in sched if c == "nightly"]
    assert nightly[:3] == [0.5, 1.0, 1.5] and len(nightly) == 199
    assert sum(c == "a" for _, c in sched) == pytest.approx(800, rel=0.1)
    with pytest.raises(ConfigError):
        next(schedule(RequestFactory(parse_workload({"name": "n", "classes": [{"name": "a"}]})), rate=None))


def test_lengths_from_the_command_line_in_the_peer_tools_forms() -> None:
    from tailguard.bench.workload import Fixed, Normal, Uniform, parse_length

    assert parse_length("512", "--input-tokens") == Fixed(value=512)
    assert parse_length("512:64", "--input-tokens") == Normal(dist="normal", mean=512, std=64)
    assert parse_length("100..1000", "--input-tokens") == Uniform(dist="uniform", low=100, high=1000)
    for bad, why in (("0", "greater than or equal to 1"), ("lots", "not a number"), ("9..3", "below low"),
                     ("1:2:3", "not a number")):
        with pytest.raises(ConfigError, match=f"--output-tokens '{bad}': 512 .*{why}"):
            parse_length(bad, "--output-tokens")


def test_lengths_replace_every_class_s_and_ask_for_full_answers() -> None:
    from tailguard.bench.workload import parse_length, with_lengths

    w = with_lengths(load_workload("fixed-lengths")[0], parse_length("300", "i"), parse_length("40..60", "o"), None)
    reqs = stream(w.model_dump(), n=200)
    assert {r.prompt_tokens for r in reqs} == {300} and {r.max_tokens for r in reqs} <= set(range(40, 61))
    assert all(orjson.loads(r.body)["ignore_eos"] is True for r in reqs)
    assert all(parse_request(r.body, "chat").prompt_tokens == 300 for r in reqs)
    mixed = with_lengths(load_workload("seed-mixed")[0], parse_length("64", "i"), None, False)
    assert {c.prompt_tokens.sample(random.Random(0)) for c in mixed.classes} == {64}
    assert [c.max_tokens for c in mixed.classes] == [c.max_tokens for c in load_workload("seed-mixed")[0].classes]
    assert not any(c.ignore_eos for c in mixed.classes)
    sourced = parse_workload({"name": "d", "classes": [{"name": "a", "source": {"path": "x.jsonl"}}]})
    with pytest.raises(ConfigError, match="class 'a' takes its prompts from x.jsonl"):
        with_lengths(sourced, parse_length("64", "i"), None, None)
