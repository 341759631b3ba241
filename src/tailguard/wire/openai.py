"""OpenAI request bodies in and out: parse and validate chat/completions requests, build
response chunks, and the one function that turns an `APIError` into OpenAI's error body. Pure.

Validation follows what vLLM accepts: fields the model does not use are kept and ignored, but a
field we do read must have the right type, so a client bug is a clear 400 instead of a 500 later.
`validate_body` checks what the gateway reads; the fields it only forwards (sampling, seed, stop,
user) are the engine's to judge (`validate_engine_fields`, which the simulator runs as vLLM
would), so the gateway neither refuses what an engine accepts nor spends admission time on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from tailguard.errors import APIError, BadRequest
from tailguard.wire import anthropic, embeddings, responses
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, parts_text, text_tokens

Endpoint = Literal["chat", "completions", "responses", "messages", "embeddings", "rerank", "score", "tokenize",
                   "detokenize"]
# Routes whose answer is one JSON body that generates nothing (`wire.embeddings`): one job sized
# by its input, relayed whole.
POOLING: frozenset[Endpoint] = frozenset({"embeddings", "rerank", "score", "tokenize", "detokenize"})
# Routes streamed as OpenAI's `chat.completion.chunk` / `text_completion` chunks, assembled from
# a stream for a non-stream client and continued from their text.
CHUNKED: frozenset[Endpoint] = frozenset({"chat", "completions"})

# Far above any real context window, low enough that arithmetic on it stays cheap and sane.
MAX_TOKENS_LIMIT = 10_000_000
# OpenAI's own bound on `n`; unbounded, one request could ask an engine for millions of sequences.
MAX_N = 128
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})


@dataclass(slots=True)
class ParsedRequest:
    """A validated request body. `body` is the parsed JSON, kept whole so it can be forwarded."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    prompt_tokens: int
    token_ids: list[int] | None = field(default=None)
    n: int = 1  # choices asked for: the engine generates each, so the job size counts each
    prompt: str | None = None  # the prompt's text, for the routes read by `wire.responses`/`anthropic`

    def prompt_text(self) -> str:
        """The prompt flattened to one string (role-tagged for chat); used for prefix hashing."""
        if self.prompt is not None:
            return self.prompt
        if self.endpoint in POOLING:
            return ""
        if self.endpoint == "completions":
            p = self.body["prompt"]
            if isinstance(p, str):
                return p
            if isinstance(p, list) and p and isinstance(p[0], str):
                return "".join(p)
            return ""
        parts: list[str] = []
        for m in self.body["messages"]:
            parts.append(str(m.get("role", "")))
            parts.append(":")
            parts.append(parts_text(m.get("content")))
            parts.append("\n")
        return "".join(parts)


def parse_request(raw: bytes, endpoint: Endpoint) -> ParsedRequest:
    """Parse and validate a request body; raises `BadRequest` with the offending `param`."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"Request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    return validate_body(body, endpoint)


def validate_body(body: dict[str, Any], endpoint: Endpoint) -> ParsedRequest:
    if endpoint not in CHUNKED:
        return _validate_other(body, endpoint)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _type_error("model", "a string")
    stream = _opt_bool(body, "stream") or False
    include_usage = False
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise _type_error("stream_options", "an object")
        include_usage = _opt_bool(so, "include_usage", "stream_options.include_usage") or False
    max_tokens = _max_tokens(body, endpoint)
    n = body.get("n")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise _type_error("n", "an integer")
        if not 1 <= n <= MAX_N:
            raise BadRequest(f"'n' must be between 1 and {MAX_N}, got {n}.", param="n", code="invalid_value")
    tier = body.get("service_tier")
    if tier is not None and not isinstance(tier, str):
        raise _type_error("service_tier", "a string")

    token_ids: list[int] | None = None
    if endpoint == "chat":
        prompt_tokens = _chat_prompt_tokens(body)
    else:
        prompt_tokens, token_ids = _completion_prompt_tokens(body)
    return ParsedRequest(endpoint, body, model, stream, include_usage, max_tokens, prompt_tokens, token_ids,
                         1 if n is None else n)


def _validate_other(body: dict[str, Any], endpoint: Endpoint) -> ParsedRequest:
    """A body of the Responses, Messages or a pooling route: what the gateway reads of it."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _type_error("model", "a string")
    if endpoint in POOLING:
        if endpoint == "embeddings":
            embeddings.inputs(body)
        return ParsedRequest(endpoint, body, model, False, False, None, embeddings.input_tokens(body), prompt="")
    stream = _opt_bool(body, "stream") or False
    if endpoint == "responses":
        limit = responses.validate(body)
        return ParsedRequest(endpoint, body, model, stream, True, limit, responses.prompt_tokens(body),
                             prompt=responses.prompt_text(body))
    limit = anthropic.validate(body)
    return ParsedRequest(endpoint, body, model, stream, True, limit, anthropic.prompt_tokens(body),
                         prompt=anthropic.prompt_text(body))


def validate_engine_fields(body: dict[str, Any]) -> None:
    """The types of the fields an engine reads and the gateway only forwards."""
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise _type_error(name, "a number")
    for name in ("seed", "priority"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise _type_error(name, "an integer")
    _opt_bool(body, "ignore_eos")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _type_error("stop", "a string or a list of strings")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _type_error("user", "a string")


def _max_tokens(body: dict[str, Any], endpoint: Endpoint) -> int | None:
    """The output limit as vLLM reads it (for chat `max_completion_tokens` wins). A chat body
    may carry both, and engines differ in which wins, so both are checked (the caps use both)."""
    value = _token_limit(body, "max_tokens")
    if endpoint == "chat":
        mct = _token_limit(body, "max_completion_tokens")
        if mct is not None:
            return mct
    return value


def _token_limit(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "an integer")
    if value < 1:
        raise BadRequest(f"'{name}' must be at least 1, got {value}.", param=name, code="invalid_value")
    if value > MAX_TOKENS_LIMIT:
        raise BadRequest(
            f"'{name}' is {value}, above the limit of {MAX_TOKENS_LIMIT}.", param=name, code="invalid_value"
        )
    return value


def _chat_prompt_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("'messages' is a required property.", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array.", param="messages", code="invalid_type")
    total = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _type_error(f"messages[{i}]", "an object")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise BadRequest(
                f"'messages[{i}].role' must be one of {sorted(_ROLES)}.", param=f"messages[{i}].role", code="invalid_value"
            )
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _type_error(f"messages[{i}].content", "a string or an array of content parts")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise _type_error(f"messages[{i}].content[{j}]", "a content part object with a 'type'")
        total += CHAT_MESSAGE_OVERHEAD_TOKENS + text_tokens(parts_text(content))
    return total


def _completion_prompt_tokens(body: dict[str, Any]) -> tuple[int, list[int] | None]:
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("'prompt' is a required property.", param="prompt", code="missing_required_parameter")
    if isinstance(prompt, str):
        return max(1, text_tokens(prompt)), None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return max(1, sum(text_tokens(p) for p in prompt)), None
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return len(prompt), list(prompt)
    raise _type_error("prompt", "a string, an array of strings or an array of token ids")


def _opt_bool(obj: dict[str, Any], key: str, param: str | None = None) -> bool | None:
    v = obj.get(key)
    if v is not None and not isinstance(v, bool):
        raise _type_error(param or key, "a boolean")
    return v


def _type_error(param: str, expected: str) -> BadRequest:
    return BadRequest(f"'{param}' must be {expected}.", param=param, code="invalid_type")


def error_fields(payload: bytes) -> tuple[dict[str, Any], Any]:
    """The fields of an error body, whatever its shape (OpenAI's `{"error": {...}}`, TGI's
    `{"error": "..."}`, FastAPI's `{"detail": ...}`), and its `error` value as it came."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    err = data.get("error") if isinstance(data, dict) else None
    return (err if isinstance(err, dict) else data if isinstance(data, dict) else {}), err


def is_json_media_type(mime: str) -> bool:
    """Whether a request's media type (lower case, no parameters) says JSON, by the rule of
    FastAPI (so vLLM and SGLang): `application/json` or `application/*+json`. A body sent as
    `text/plain` or a form is refused: those are what a web page may post cross-site without a
    CORS preflight, so accepting them would let any page a user opens spend a local gateway's GPU."""
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def error_body(err: APIError) -> bytes:
    """The one place an `APIError` becomes OpenAI's error JSON."""
    return orjson.dumps(
        {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}
    )


def error_headers(err: APIError) -> dict[str, str]:
    headers = dict(err.headers)
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, int(err.retry_after_s + 0.999)))
        # HTTP's Retry-After is whole seconds; the openai SDKs read this one first, to the ms.
        headers["retry-after-ms"] = str(max(1, round(err.retry_after_s * 1000)))
    return headers


def ratelimit_headers(kind: str, limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*` headers for one limit (`kind`: requests or tokens)."""
    return {f"x-ratelimit-limit-{kind}": str(limit), f"x-ratelimit-remaining-{kind}": str(remaining),
            f"x-ratelimit-reset-{kind}": duration_text(reset_s)}


def duration_text(seconds: float) -> str:
    """As OpenAI writes a wait or a reset: `20ms`, `1s`, `17.5s`, `6m0s`."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.0f}s" if minutes >= 1 else f"{rest:.3g}s"


# --- response building (simulator and gateway non-stream assembly) ---------------------------

def chat_chunk(
    id: str, model: str, created: int, *, content: str | None = None, role: str | None = None,
    finish_reason: str | None = None, usage: dict[str, int] | None = None, empty_choices: bool = False,
) -> bytes:
    """One `chat.completion.chunk` as JSON bytes."""
    choices: list[dict[str, Any]] = []
    if not empty_choices:
        delta: dict[str, Any] = {}
        if role is not None:
            delta["role"] = role
            delta["content"] = content if content is not None else ""
        elif content is not None:
            delta["content"] = content
        choices.append({"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason})
    obj: dict[str, Any] = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
    if usage is not None:
        obj["usage"] = usage
    return orjson.dumps(obj)


def completion_chunk(
    id: str, model: str, created: int, *, text: str = "", finish_reason: str | None = None,
    usage: dict[str, int] | None = None, empty_choices: bool = False,
) -> bytes:
    """One streamed `text_completion` object as JSON bytes."""
    choices: list[dict[str, Any]] = []
    if not empty_choices:
        choices.append({"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason})
    obj: dict[str, Any] = {"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices}
    if usage is not None:
        obj["usage"] = usage
    return orjson.dumps(obj)


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_response(
    id: str, model: str, created: int, content: str, finish_reason: str, usage: dict[str, int]
) -> bytes:
    return orjson.dumps({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
    })


def completion_response(
    id: str, model: str, created: int, text: str, finish_reason: str, usage: dict[str, int]
) -> bytes:
    return orjson.dumps({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
    })
