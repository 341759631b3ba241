"""What a request asks of the simulated engine: checked against its limits (refused as vLLM
words it) and keyed for its prefix cache; pure, no I/O.
"""

from __future__ import annotations

from tailguard.errors import BadRequest
from tailguard.sim.answer import TOKEN_TEXT
from tailguard.sim.cost import EngineConfig
from tailguard.sim.kv import text_block_hashes, token_block_hashes
from tailguard.wire import openai as wire


def output_budget(cfg: EngineConfig, parsed: wire.ParsedRequest) -> int:
    """The tokens `parsed` may generate: its `max_tokens`, or up to `max_model_len` without one.
    `BadRequest` where vLLM refuses it: past the context length, a non-zero `priority` unless the
    policy is "priority", or more than one choice."""
    prompt = parsed.prompt_tokens
    limit = cfg.max_model_len
    max_tokens = parsed.max_tokens
    if max_tokens is None:
        if prompt >= limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, your request has {prompt} "
                "input tokens. Please reduce the length of the input messages.",
                param="messages" if parsed.endpoint == "chat" else "prompt", code="context_length_exceeded",
            )
        max_tokens = limit - prompt
    elif prompt + max_tokens > limit:
        raise BadRequest(
            f"This model's maximum context length is {limit} tokens. However, you requested {prompt + max_tokens} "
            f"tokens ({prompt} in the messages, {max_tokens} in the completion). Please reduce the length of "
            "the messages or completion.",
            param="max_tokens", code="context_length_exceeded",
        )
    priority = parsed.body.get("priority") or 0
    if priority != 0 and cfg.scheduling_policy != "priority":
        raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.", param="priority",
                         code="invalid_value")
    n = parsed.body.get("n")
    if n is not None and n != 1:
        raise BadRequest("The simulator generates one choice per request ('n' must be 1).", param="n",
                         code="invalid_value")
    return max_tokens


def block_keys(cfg: EngineConfig, parsed: wire.ParsedRequest, max_tokens: int) -> tuple[int, ...]:
    """Prefix-cache keys of the request's whole sequence: its prompt as the engine would render
    it, then the output it will generate (every token is TOKEN_TEXT). Keying the output too is what
    lets a continuation (prompt + text so far, as the gateway resumes a suspended request) find the
    blocks its aborted original left cached, as vLLM's prefix cache finds them by token ids."""
    if not cfg.enable_prefix_caching:
        return ()
    bs = cfg.block_size
    if parsed.token_ids is not None:
        return token_block_hashes(parsed.token_ids, bs)
    text = _sequence_prefix(parsed) + TOKEN_TEXT * max_tokens
    return text_block_hashes(text, bs, max_blocks=(parsed.prompt_tokens + max_tokens) // bs)


def _sequence_prefix(parsed: wire.ParsedRequest) -> str:
    """The text generation continues from. Chat is rendered like a chat template: each message,
    then the assistant's turn opened (or, with `continue_final_message`, the last message left
    open), so a continuation's text starts with its original's text and generated output."""
    text = parsed.prompt_text()
    if parsed.endpoint == "completions":
        return text
    if parsed.body.get("continue_final_message") is True:
        return text[:-1]  # the last message's closing newline: it stays open
    return text + "assistant:"
