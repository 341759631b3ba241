"""The simulator's pooling and tokenizer routes: what each costs the engine, how pairs are formed
as vLLM forms them, and the answers' shapes."""

from __future__ import annotations

import orjson
import pytest

from tailguard.errors import BadRequest
from tailguard.sim import pooling


def test_each_input_or_pair_is_one_prefill_sized_by_its_tokens() -> None:
    assert pooling.prefills("embeddings", {"input": ["abcd", "abcdefgh"]}) == [1, 2]
    assert pooling.prefills("embeddings", {"input": [[1, 2, 3]]}) == [3]
    assert pooling.prefills("rerank", {"query": "abcd", "documents": ["abcdefgh", "x"]}) == [3, 2]
    assert pooling.prefills("score", {"text_1": ["a", "b"], "text_2": ["abcdefgh", "c"]}) == [3, 2]
    # vLLM's API server tokenizes without the engine: no engine work.
    assert pooling.prefills("tokenize", {"prompt": "hello"}) == []
    assert pooling.prefills("detokenize", {"tokens": [1, 2]}) == []


def test_score_pairs_one_text_with_each_or_lists_pairwise() -> None:
    assert pooling.pairs("score", {"text_1": "q", "text_2": ["a", "b"]}) == [("q", "a"), ("q", "b")]
    assert pooling.pairs("score", {"text_1": ["q", "r"], "text_2": ["a", "b"]}) == [("q", "a"), ("r", "b")]
    with pytest.raises(BadRequest) as e:
        pooling.pairs("score", {"text_1": ["q", "r"], "text_2": ["a", "b", "c"]})
    assert e.value.param == "text_1"


@pytest.mark.parametrize("endpoint,body,param", [
    ("rerank", {"query": 1, "documents": ["a"]}, "query"),
    ("rerank", {"query": "q", "documents": []}, "documents"),
    ("tokenize", {}, "prompt"),
    ("detokenize", {"tokens": ["a"]}, "tokens"),
])
def test_bad_bodies_are_refused_naming_the_field(endpoint: str, body: dict[str, object], param: str) -> None:
    with pytest.raises(BadRequest) as e:
        pooling.prefills(endpoint, body)  # type: ignore[arg-type]
    assert e.value.param == param


def test_rerank_sorts_by_score_and_keeps_top_n() -> None:
    body = {"query": "cat", "documents": ["a", "b", "c"], "top_n": 2}
    out = orjson.loads(pooling.answer("rerank", body, "m", "rerank-1", 0, 100))
    scores = [r["relevance_score"] for r in out["results"]]
    assert len(scores) == 2 and scores == sorted(scores, reverse=True)
    assert out["results"][0]["relevance_score"] == pooling.score("cat", out["results"][0]["document"]["text"])
    assert out["usage"] == {"prompt_tokens": 6, "total_tokens": 6}


def test_tokenize_counts_as_the_gateway_does_and_detokenize_gives_each_token() -> None:
    out = orjson.loads(pooling.answer("tokenize", {"prompt": "hello world"}, "m", "x", 0, 4096))
    assert (out["count"], len(out["tokens"]), out["max_model_len"]) == (3, 3, 4096)
    chat = orjson.loads(pooling.answer("tokenize", {"messages": [{"role": "user", "content": "hi"}]}, "m", "x", 0, 1))
    assert chat["count"] == 4 + 1  # the chat template's overhead and the text
    assert orjson.loads(pooling.answer("detokenize", {"tokens": [5, 6]}, "m", "x", 0, 1)) == {"prompt": " tok tok"}
