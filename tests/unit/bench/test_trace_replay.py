"""A trace made ready to replay: the part kept and its time compressed, the prompt text of its
blocks, the rule file's classes, and the requests built from it, sized as the gateway and the
simulator count them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tailguard.bench.trace.blocks import PromptText, block_reuse
from tailguard.bench.trace.plan import SESSION_HEADER, TraceFactory, TraceSpec, load_replay
from tailguard.bench.trace.request import TraceRequest
from tailguard.bench.trace.rules import Rules, TraceClass
from tailguard.bench.trace.timing import Window, select
from tailguard.errors import ConfigError
from tailguard.wire.openai import parse_request
from tailguard.wire.tokens import text_tokens

DATA = Path(__file__).resolve().parents[2] / "data"


def req(at: float, i: int = 100, o: int = 10, ids: tuple[int, ...] = (), **fields: object) -> TraceRequest:
    return TraceRequest(at, i, o, 1, hash_ids=ids, fields=fields)  # type: ignore[arg-type]


# --- time: window, limit, speed ----------------------------------------------------------------

def test_speed_compresses_every_gap_and_the_clock_starts_at_the_first_kept() -> None:
    trace = [req(t) for t in (0.0, 1.0, 3.0, 7.0, 15.0)]
    assert [r.at for r in select(trace, speed=2.0)] == [0.0, 0.5, 1.5, 3.5, 7.5]
    assert [r.at for r in select(trace, speed=0.5)] == [0.0, 2.0, 6.0, 14.0, 30.0]
    assert [r.at for r in select(trace, window=Window.parse("1:6"))] == [0.0, 2.0]  # 1.0 and 3.0, from 1.0
    assert [r.at for r in select(trace, window=Window.parse("1:10"), limit=2, speed=4.0)] == [0.0, 0.5]


def test_window_forms_and_bad_values() -> None:
    assert Window.parse("10m:5m") == Window(600.0, 300.0)
    assert Window.parse("90:1.5h") == Window(90.0, 5400.0)
    for bad in ("300", "a:b", "10:0", "-5:10", "10:"):
        with pytest.raises(ConfigError, match="--window"):
            Window.parse(bad)
    with pytest.raises(ConfigError, match="no request of the trace is due in --window 100:5"):
        select([req(0.0), req(1.0)], window=Window(100.0, 5.0))
    with pytest.raises(ConfigError, match="--speed must be > 0"):
        select([req(0.0)], speed=0)
    with pytest.raises(ConfigError, match="--limit must be at least 1"):
        select([req(0.0)], limit=0)


# --- the prompt text of shared blocks -----------------------------------------------------------

def test_the_same_hash_ids_give_the_same_text_and_other_blocks_share_nothing() -> None:
    texts = PromptText(seed=3, block_tokens=512)
    a = texts.text(0, (1, 2, 3), 1400)
    b = PromptText(seed=3, block_tokens=512).text(9, (1, 2, 4), 1536)
    assert text_tokens(a) == 1400 and text_tokens(b) == 1536 and len(a) == 1400 * 4
    assert a[:1024 * 4] == b[:1024 * 4]  # blocks 1 and 2 shared
    assert a[4096:4096 + 64] != b[4096:4096 + 64]  # block 3 against block 4: not even their first 16 tokens alike
    assert texts.block(1) == a[:2048] and texts.text(5, (1, 2, 3), 1400) == a  # deterministic
    assert PromptText(seed=4, block_tokens=512).block(1)[:64] != texts.block(1)[:64]  # another seed: nothing shared
    own, own2 = texts.text(1, (), 300), texts.text(2, (), 300)
    assert text_tokens(own) == 300 and own[:64] != own2[:64]
    longer = texts.text(3, (1,), 700)  # past its blocks: its own text
    assert longer[:2048] == texts.block(1) and text_tokens(longer) == 700


def test_block_reuse_counts_a_leading_run_as_a_prefix_cache_does() -> None:
    trace = [req(0, 1024, ids=(1, 2)),          # nothing before it
             req(1, 1536, ids=(1, 2, 3)),       # 1024 reused
             req(2, 1024, ids=(9, 2)),          # 2 was seen, but after a new block: no prefix hit
             req(3, 300, ids=(1,)),             # 300 of block 1
             req(4, 1200, ids=(1, 2, 3))]       # 1024 + 176 (block 3 was 512 long before)
    assert block_reuse(trace, 512) == pytest.approx((1024 + 300 + 1200) / (1024 + 1536 + 1024 + 300 + 1200))
    assert block_reuse([req(0, 10)], 512) is None and block_reuse(trace, 0) is None


# --- classes from a rule file -------------------------------------------------------------------

def test_rules_take_the_first_class_that_matches() -> None:
    rules = Rules.model_validate({"classes": [
        {"name": "api", "when": {"Log Type": "API log"}, "headers": {"X-Tailguard-Class": "batch"}},
        {"name": "long", "when": {"input_tokens": {"min": 4000}}},
        {"name": "gpt4", "when": {"Model": ["GPT-4", "GPT-4o"], "Total tokens": {"max": 5000}}},
        {"name": "big", "when": {"Total tokens": 9000}},
        {"name": "match", "when": {"Model": {"matches": "^Chat"}}},
    ]})

    def cls(**f: object) -> str | None:
        c = rules.classify(req(0, int(f.pop("i", 100)), **f))  # type: ignore[call-overload]
        return None if c is None else c.name

    assert cls(**{"Log Type": "API log", "Model": "GPT-4"}) == "api"
    assert cls(i=5000, **{"Log Type": "Conversation log"}) == "long"
    assert cls(Model="GPT-4o", **{"Total tokens": "4000"}) == "gpt4"  # a CSV column's text as a number
    assert cls(Model="GPT-4", **{"Total tokens": "9000"}) == "big"
    assert cls(Model="ChatGPT", **{"Total tokens": "10"}) == "match"
    assert cls(Model="Llama", **{"Total tokens": "10"}) is None


def test_a_rule_on_a_field_the_trace_lacks_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("classes:\n  - name: api\n    when: {LogType: API log}\n")
    with pytest.raises(ConfigError, match=r"class 'api' tests 'LogType', which the trace does not have \(its fields: "
                                          r".*Log Type"):
        load_replay(TraceSpec(str(DATA / "burstgpt_500.csv"), rules=str(path)))
    path.write_text("classes:\n  - name: api\n    when: {Model: {matches: '('}}\n")
    with pytest.raises(ConfigError, match="not a regular expression"):
        load_replay(TraceSpec(str(DATA / "burstgpt_500.csv"), rules=str(path)))
    path.write_text("classes:\n  - name: a\n  - name: a\n")
    with pytest.raises(ConfigError, match="repeated: \\['a'\\]"):
        load_replay(TraceSpec(str(DATA / "burstgpt_500.csv"), rules=str(path)))


# --- the requests sent -----------------------------------------------------------------------------

def test_each_request_is_the_trace_s_size_as_the_gateway_counts_it() -> None:
    replay = load_replay(TraceSpec(str(DATA / "azure_conv_500.csv"), limit=50))
    f = TraceFactory(replay, seed=1, model="m")
    for i, r in enumerate(replay.requests):
        planned = f.next()
        body = orjson.loads(planned.body)
        parsed = parse_request(planned.body, "chat")
        assert parsed.prompt_tokens == planned.prompt_tokens == max(r.input_tokens, 5), i
        assert body["max_tokens"] == planned.max_tokens == max(1, r.output_tokens)
        assert body["ignore_eos"] is True and body["stream"] is True and body["model"] == "m"
        assert planned.cls == "trace" and planned.headers == ()
    assert [at for at, _ in f.schedule()] == [r.at for r in replay.requests]


def test_sessions_classes_and_routes_are_sent_as_the_trace_says(tmp_path: Path) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 0, "hash_ids": [1, 2], "session_id": "u7"}\n'
                     '{"timestamp": 250, "input_length": 3, "output_length": 5, "hash_ids": [1]}\n')
    rules = tmp_path / "rules.yaml"
    rules.write_text("classes:\n  - name: chat\n    when: {session: u7}\n    headers: {X-Tailguard-Class: interactive}\n"
                     "    body: {temperature: 0}\n    slo: {ttft_s: 0.5}\n")
    replay = load_replay(TraceSpec(str(trace), rules=str(rules), ignore_eos=False))
    f = TraceFactory(replay, model="m", endpoint="completions")
    a, b = f.next(), f.next()
    body = orjson.loads(a.body)
    assert a.path == "/v1/completions" and body["user"] == "u7" and body["temperature"] == 0
    assert dict(a.headers) == {"X-Tailguard-Class": "interactive", SESSION_HEADER: "u7"} and a.session == "u7"
    assert "ignore_eos" not in body and a.max_tokens == 1 and a.prompt_tokens == 600
    assert text_tokens(body["prompt"]) == 600
    assert b.cls == "other" and b.headers == () and b.prompt_tokens == 3  # no class took it
    d = f.describe()
    assert d["classes"] == {"chat": 1, "other": 1} and d["sessions"] == 1 and d["block_reuse"] == round(3 / 603, 4)
    assert any("0 output tokens" in n for n in d["notes"])
    assert f.workload.slos() == {"chat": {"ttft_s": 0.5}}
    with pytest.raises(ConfigError, match="chat or completions"):
        TraceFactory(replay, endpoint="embeddings")


def test_a_gateway_log_replays_each_request_in_its_class() -> None:
    replay = load_replay(TraceSpec(str(DATA / "tailguard_access_500.jsonl")))
    f = TraceFactory(replay)
    sent = [f.next() for _ in range(len(f))]
    assert {p.cls for p in sent} == {"interactive", "batch"}
    assert all(dict(p.headers) == {"X-Tailguard-Class": p.cls} for p in sent)
    assert [TraceClass(name="x").name] == ["x"]
