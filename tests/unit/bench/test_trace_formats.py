"""Each trace format's reader: the fields it keeps, the order it gives, the format found from the
first line, and every malformed line an error that names the file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.bench.trace.formats import read_trace, sniff
from tailguard.bench.trace.jsonl import read_mooncake, read_tailguard, recorded_latency
from tailguard.bench.trace.tables import read_azure, read_burstgpt
from tailguard.errors import TraceError

DATA = Path(__file__).resolve().parents[2] / "data"


def lines(text: str) -> list[str]:
    return text.strip("\n").splitlines(keepends=True)


def test_azure_reads_instants_and_sizes() -> None:
    reqs = read_azure(lines("""TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
"""), "a.csv")
    assert [(r.input_tokens, r.output_tokens, r.line) for r in reqs] == [(374, 44, 2), (396, 109, 3)]
    assert reqs[1].at - reqs[0].at == pytest.approx(4.314579, abs=1e-6)
    assert reqs[0].fields["ContextTokens"] == "374"


@pytest.mark.parametrize("text,message", [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n", "a.csv:1: the header has no column 'GeneratedTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "a.csv:2: TIMESTAMP 'yesterday' is not a date"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\n2023-11-16 18:15:47,-3,4\n",
     "a.csv:3: ContextTokens '-3' is not a whole number"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1.5,2\n", "a.csv:2: ContextTokens '1.5'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n", "a.csv:2: 2 columns, the header has 3"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,2\n", "a.csv:2: ContextTokens 'x' is not a number"),
])
def test_azure_malformed_lines_name_the_line(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(".", r"\.")):
        read_azure(lines(text), "a.csv")


def test_burstgpt_keeps_its_columns_for_rules() -> None:
    reqs = read_burstgpt(lines("""Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45.5,GPT-4,1020,0,1020,API log
"""), "b.csv")
    assert [(r.at, r.input_tokens, r.output_tokens) for r in reqs] == [(5.0, 472, 18), (45.5, 1020, 0)]
    assert reqs[1].value("Log Type") == "API log" and reqs[1].value("Model") == "GPT-4"
    assert reqs[1].value("input_tokens") == 1020


@pytest.mark.parametrize("text,message", [
    ("Timestamp,Model,Request tokens\n1,m,2\n", "b.csv:1: the header has no column 'Response tokens'"),
    ("Timestamp,Request tokens,Response tokens\nsoon,2,3\n", "b.csv:2: Timestamp 'soon' is not a number of seconds"),
    ("Timestamp,Request tokens,Response tokens\n1,2,3\nnan,2,3\n", "b.csv:3: Timestamp 'nan'"),
    ("Timestamp,Request tokens,Response tokens\n1,2,three\n", "b.csv:2: Response tokens 'three' is not a number"),
])
def test_burstgpt_malformed_lines_name_the_line(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_burstgpt(lines(text), "b.csv")


def test_mooncake_reads_blocks_and_sessions() -> None:
    reqs = read_mooncake(lines("""
{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}

{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47], "session_id": "abc"}
"""), "m.jsonl")
    assert [(r.at, r.input_tokens, r.output_tokens, r.hash_ids, r.session, r.line) for r in reqs] == [
        (0.0, 655, 52, (46, 47), None, 1), (10.535, 672, 26, (46, 47), "abc", 3)]


@pytest.mark.parametrize("text,message", [
    ('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 1, "input_length": 10\n',
     "m.jsonl:2: not JSON"),
    ('{"input_length": 10, "output_length": 2}\n', "m.jsonl:1: timestamp is missing"),
    ('{"timestamp": "0", "input_length": 10, "output_length": 2}\n', "m.jsonl:1: timestamp is '0', not a number"),
    ('{"timestamp": 0, "input_length": 10.5, "output_length": 2}\n', "m.jsonl:1: input_length is 10.5"),
    ('{"timestamp": 0, "input_length": 10, "output_length": -2}\n', "m.jsonl:1: output_length is -2"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, "2"]}\n',
     "m.jsonl:1: hash_ids is \\[1, '2'\\], not a list of integers"),
    ('[1, 2]\n', "m.jsonl:1: each line is one JSON object, not list"),
])
def test_mooncake_malformed_lines_name_the_line(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_mooncake(lines(text), "m.jsonl")


def test_the_access_log_gives_arrivals_classes_and_routes() -> None:
    log = lines("""
{"ts":"2026-01-01T00:00:00.100+00:00","level":"info","event":"start","message":"listening"}
{"ts":"2026-01-01T00:00:02.500+00:00","level":"info","event":"access","path":"/v1/chat/completions","status":200,"outcome":"success","class":"batch","model":"m","queue_ms":5.0,"ttft_ms":200.0,"e2e_ms":1500.0,"prompt_tokens":300,"output_tokens":40,"caller":"app"}
{"ts":"2026-01-01T00:00:01.000+00:00","level":"info","event":"access","path":"/nope","status":404,"reason":null}
{"ts":"2026-01-01T00:00:01.200+00:00","level":"info","event":"access","path":"/v1/completions","status":200,"outcome":"success","class":"interactive","model":"m","ttft_ms":50.0,"e2e_ms":100.0,"prompt_tokens":20,"output_tokens":8}
""")
    reqs, skipped = read_tailguard(log, "gw.log")
    assert skipped == 2  # the start line and the 404 (no generation)
    a, b = reqs
    assert (a.cls, a.class_header, a.endpoint, a.input_tokens, a.output_tokens) == ("batch", "batch", "chat", 300, 40)
    assert b.at - a.at == pytest.approx((1.2 - 0.1) - (2.5 - 1.5), abs=1e-6)  # arrival = end - e2e
    assert b.endpoint == "completions" and a.value("caller") == "app"
    assert recorded_latency(a) == (pytest.approx(0.2), pytest.approx(1.5))


def test_the_bench_records_replay_what_was_sent() -> None:
    reqs, _ = read_tailguard(lines("""
{"index":0,"cls":"chat","warmup":false,"scheduled_at":0.5,"ok":true,"prompt_tokens":100,"usage_prompt_tokens":101,"max_tokens":32,"output_tokens":32,"server_class":"interactive","session":"s1","first_token_at":0.7,"ended_at":1.5}
{"index":1,"cls":"summary","warmup":false,"scheduled_at":0.9,"ok":false,"prompt_tokens":300,"max_tokens":2048,"output_tokens":10}
"""), "requests.jsonl")
    ok, cut = reqs
    assert (ok.input_tokens, ok.output_tokens, ok.session, ok.class_header) == (101, 32, "s1", "interactive")
    assert (cut.input_tokens, cut.output_tokens, cut.class_header) == (300, 2048, None)  # what it asked for
    assert recorded_latency(ok) == (pytest.approx(0.2), pytest.approx(1.0)) and recorded_latency(cut) == (None, None)


@pytest.mark.parametrize("text,message", [
    ('{"event":"access","ts":"yesterday","e2e_ms":1,"prompt_tokens":1,"output_tokens":1}\n', "gw.log:1: ts 'yesterday'"),
    ('{"event":"access","ts":"2026-01-01T00:00:00+00:00","prompt_tokens":1,"output_tokens":1}\n',
     "gw.log:1: e2e_ms is missing"),
    ('{"index": 3}\n', "gw.log:1: neither an access-log line"),
    ('not json\n', "gw.log:1: not JSON"),
])
def test_tailguard_malformed_lines_name_the_line(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_tailguard(lines(text), "gw.log")


@pytest.mark.parametrize("name,fmt", [("azure_conv_500.csv", "azure"), ("burstgpt_500.csv", "burstgpt"),
                                      ("mooncake_500.jsonl", "mooncake"), ("tailguard_access_500.jsonl", "tailguard")])
def test_each_excerpt_is_found_by_its_first_line_and_read_in_order(name: str, fmt: str) -> None:
    trace = read_trace(DATA / name)
    assert trace.format == fmt and len(trace.requests) == 500
    ats = [r.at for r in trace.requests]
    assert ats[0] == 0.0 and ats == sorted(ats)
    assert trace.block_tokens == (512 if fmt == "mooncake" else 0)


def test_unknown_and_empty_files_say_what_to_do(tmp_path: Path) -> None:
    odd = tmp_path / "odd.txt"
    odd.write_text("when,what\n1,2\n")
    with pytest.raises(TraceError, match=r"odd.txt:1: not a trace format .* give --trace-format \(azure, burstgpt"):
        read_trace(odd)
    with pytest.raises(TraceError, match="--trace-format 'parquet': the formats are azure, burstgpt, mooncake"):
        read_trace(odd, "parquet")
    empty = tmp_path / "empty.csv"
    empty.write_text("\n\n")
    with pytest.raises(TraceError, match="the file is empty"):
        read_trace(empty)
    with pytest.raises(TraceError, match="No such file"):
        read_trace(tmp_path / "missing.csv")
    assert sniff('{"timestamp": 0, "input_length": 3}', "x") == "mooncake"
    assert sniff('{"index": 0, "scheduled_at": 0.1}', "x") == "tailguard"
