"""What the simulated engine accepts, on plain requests: its output budget, vLLM's refusals, and
the prefix keys that let a continuation find its original's blocks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tailguard.errors import BadRequest
from tailguard.sim.answer import TOKEN_TEXT
from tailguard.sim.cost import EngineConfig
from tailguard.sim.request import block_keys, output_budget
from tailguard.wire import openai as wire

CFG = replace(EngineConfig.from_preset("h100-llama8b"), max_model_len=1000)


def chat(content: str, **extra: Any) -> wire.ParsedRequest:
    return wire.validate_body({"model": "m", "messages": [{"role": "user", "content": content}], **extra}, "chat")


def test_without_max_tokens_the_budget_is_the_rest_of_the_context() -> None:
    p = chat("x" * 400)  # 100 prompt tokens by the bytes/4 estimate, give or take the template
    assert output_budget(CFG, p) == 1000 - p.prompt_tokens
    assert output_budget(CFG, chat("hi", max_tokens=30)) == 30


def test_past_the_context_length_is_refused_as_vllm_words_it() -> None:
    with pytest.raises(BadRequest, match="maximum context length is 1000 tokens") as e:
        output_budget(CFG, chat("x" * 5000))
    assert e.value.param == "messages" and e.value.code == "context_length_exceeded"
    with pytest.raises(BadRequest, match=r"you requested \d+ tokens") as e:
        output_budget(CFG, chat("hi", max_tokens=1000))
    assert e.value.param == "max_tokens"


def test_priority_needs_the_priority_policy_and_n_must_be_one() -> None:
    with pytest.raises(BadRequest, match="Priority scheduling is not enabled"):
        output_budget(CFG, chat("hi", max_tokens=5, priority=1))
    assert output_budget(replace(CFG, scheduling_policy="priority"), chat("hi", max_tokens=5, priority=1)) == 5
    assert output_budget(CFG, chat("hi", max_tokens=5, priority=0, n=1)) == 5
    with pytest.raises(BadRequest, match="'n' must be 1"):
        output_budget(CFG, chat("hi", max_tokens=5, n=2))


def test_a_continuation_finds_the_blocks_of_its_original() -> None:
    cfg = replace(CFG, enable_prefix_caching=True)
    question = "q" * 300
    original = chat(question, max_tokens=100)
    generated = TOKEN_TEXT * 40
    continuation = wire.validate_body({"model": "m", "max_tokens": 60, "continue_final_message": True, "messages": [
        {"role": "user", "content": question}, {"role": "assistant", "content": generated}]}, "chat")
    a = block_keys(cfg, original, 100)
    # Prompt + 40 generated + 60 to go is the original's whole sequence: the same full blocks.
    assert len(a) == (original.prompt_tokens + 100) // 16 > 0
    assert block_keys(cfg, continuation, 60) == a


def test_no_keys_without_the_prefix_cache() -> None:
    assert block_keys(CFG, chat("q" * 300, max_tokens=10), 10) == ()
