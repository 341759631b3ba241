"""Every line of a batch input checked before any runs; errors name the line (1-based)."""

from __future__ import annotations

import orjson

from tailguard.batch.validation import check

URL = "/v1/chat/completions"


def line(cid: str, **over: object) -> bytes:
    obj = {"custom_id": cid, "method": "POST", "url": URL,
           "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
    obj.update(over)
    return orjson.dumps(obj)


def test_a_valid_file_gives_its_lines_in_order() -> None:
    got = check(b"\n".join([line("a"), line("b")]) + b"\n\n", URL, 10)
    assert got.errors == [] and [cid for cid, _ in got.lines] == ["a", "b"]
    assert orjson.loads(got.lines[0][1])["max_tokens"] == 4


def test_a_valid_file_counts_the_tokens_its_lines_may_use() -> None:
    one = check(line("a") + b"\n", URL, 10).tokens
    assert one > 4  # its prompt estimate and its max_tokens
    n2 = line("b", body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2})
    assert check(b"\n".join([line("a"), n2]), URL, 10).tokens == 2 * one + 4  # each choice may use max_tokens
    assert check(b"\n".join([line("a"), line("a")]), URL, 10).tokens == 0  # a bad file holds nothing


def test_each_bad_line_is_named_and_no_line_is_kept() -> None:
    bad = [line("a"), line("a"), line("b", url="/v1/completions"), b"[1]", line("c", method="GET"),
           line("d", body={"model": "m", "messages": "no"}), line("e", body={"model": "m", "messages": [], "stream": True}),
           orjson.dumps({"method": "POST"})]
    got = check(b"\n".join(bad), URL, 100)
    assert got.lines == []
    assert [(e["line"], e["code"]) for e in got.errors] == [
        (2, "duplicate_custom_id"), (3, "mismatched_endpoint"), (4, "invalid_json"), (5, "invalid_method"),
        (6, got.errors[4]["code"]), (7, "invalid_request"), (8, "missing_required_parameter")]
    assert got.errors[4]["param"].startswith("body.")


def test_empty_and_too_long_files_fail_as_a_whole() -> None:
    assert check(b"\n \n", URL, 10).errors[0]["code"] == "empty_file"
    assert check(b"\n".join(line(str(i)) for i in range(4)), URL, 3).errors[0]["code"] == "too_many_lines"
