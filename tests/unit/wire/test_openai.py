import orjson
import pytest

from tailguard.errors import BadRequest, Overloaded
from tailguard.wire.openai import (
    error_body, error_headers, is_json_media_type, parse_request, ratelimit_headers, validate_engine_fields,
)
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, synthetic_text, text_tokens


def chat(**kw: object) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "abcdefgh"}]}
    body.update(kw)
    return orjson.dumps(body)


def test_chat_fields_and_prompt_estimate() -> None:
    r = parse_request(chat(stream=True, stream_options={"include_usage": True}, max_tokens=7, extra_field=1), "chat")
    assert (r.stream, r.include_usage, r.max_tokens) == (True, True, 7)
    assert r.prompt_tokens == CHAT_MESSAGE_OVERHEAD_TOKENS + 2
    assert r.body["extra_field"] == 1


def test_max_completion_tokens_wins_for_chat() -> None:
    assert parse_request(chat(max_tokens=5, max_completion_tokens=9), "chat").max_tokens == 9


def test_completion_token_ids_counted_exactly() -> None:
    r = parse_request(b'{"model":"m","prompt":[1,2,3,4,5]}', "completions")
    assert r.prompt_tokens == 5 and r.token_ids == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "raw,endpoint,param",
    [
        (b"{not json", "chat", None),
        (b"[1,2]", "chat", None),
        (b'{"model":"m"}', "chat", "messages"),
        (b'{"model":"m","messages":[]}', "chat", "messages"),
        (b'{"model":"m","messages":[{"role":"wizard","content":"x"}]}', "chat", "messages[0].role"),
        (b'{"model":"m","messages":"hi"}', "chat", "messages"),
        (chat(max_tokens=-1), "chat", "max_tokens"),
        (chat(max_tokens=0), "chat", "max_tokens"),
        (chat(max_tokens=10**15), "chat", "max_tokens"),
        (chat(max_tokens="12"), "chat", "max_tokens"),
        (chat(max_tokens=True), "chat", "max_tokens"),
        (chat(stream="yes"), "chat", "stream"),
        (chat(max_completion_tokens=5, max_tokens="9"), "chat", "max_tokens"),
        (chat(n=0), "chat", "n"),
        (chat(n=129), "chat", "n"),
        (chat(n=2.0), "chat", "n"),
        (chat(stream_options=[1]), "chat", "stream_options"),
        (b'{"model":"m"}', "completions", "prompt"),
        (b'{"model":"m","prompt":{"a":1}}', "completions", "prompt"),
        (b'{"model":"m","prompt":[1,"a"]}', "completions", "prompt"),
    ],
)
def test_bad_requests_name_the_param(raw: bytes, endpoint: str, param: str | None) -> None:
    with pytest.raises(BadRequest) as e:
        parse_request(raw, endpoint)  # type: ignore[arg-type]
    assert e.value.status == 400
    assert e.value.param == param


def test_fields_the_gateway_only_forwards_are_left_to_the_engine() -> None:
    body = parse_request(chat(temperature="hot", seed="s", stop=5, user=1), "chat").body
    with pytest.raises(BadRequest) as e:
        validate_engine_fields(body)
    assert e.value.param == "temperature"
    validate_engine_fields(parse_request(chat(temperature=0.5, seed=1, stop=["x"], priority=-1), "chat").body)


@pytest.mark.parametrize("mime,ok", [
    ("application/json", True), ("application/vnd.api+json", True), ("text/plain", False),
    ("application/x-www-form-urlencoded", False), ("multipart/form-data", False), ("application/octet-stream", False),
])
def test_json_media_types_are_fastapis(mime: str, ok: bool) -> None:
    assert is_json_media_type(mime) is ok


def test_error_body_shape_and_retry_after() -> None:
    err = Overloaded("full", code="queue_full", retry_after_s=2.2, headers={"X-Tailguard-Reject-Reason": "queue_full"})
    body = orjson.loads(error_body(err))
    assert set(body["error"]) == {"message", "type", "param", "code"}
    # HTTP's whole seconds, rounded up, and the exact wait for the openai SDKs (they read it first).
    assert error_headers(err) == {"X-Tailguard-Reject-Reason": "queue_full", "Retry-After": "3", "retry-after-ms": "2200"}


def test_synthetic_text_has_exact_estimate() -> None:
    for n in (1, 7, 32, 2048):
        assert text_tokens(synthetic_text(n)) == n
    assert text_tokens("é") == 1 and text_tokens("ééé") == 2


def test_ratelimit_headers_are_openais() -> None:
    assert ratelimit_headers("tokens", 600, 12, 90.0) == {
        "x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "12", "x-ratelimit-reset-tokens": "1m30s"}
    resets = [ratelimit_headers("requests", 1, 0, s)["x-ratelimit-reset-requests"] for s in (0.02, 1.0, 17.5, 360.0)]
    assert resets == ["20ms", "1s", "17.5s", "6m0s"]
