"""Which refusals drop a field the gateway added, and what is sent once it is dropped."""

from __future__ import annotations

import orjson

from tailguard.config import BackendConfig
from tailguard.gateway.upstream.backends import translate_body
from tailguard.gateway.upstream.client import upstream_body
from tailguard.gateway.upstream.kinds import get_kind
from tailguard.gateway.upstream.refusals import Refusals, added_fields, refused_field

VLLM_400 = orjson.dumps({"error": {"message": "Got priority 1 but Priority scheduling is not enabled.",
                                   "type": "BadRequestError", "param": None, "code": 400}})


def test_vllms_priority_refusal_names_the_field() -> None:
    added = added_fields(get_kind("vllm"), count_tokens=False)
    assert added == ("priority",)
    assert refused_field(400, VLLM_400, added) == "priority"
    assert refused_field(422, VLLM_400, added) is None  # only a 400 is a refusal of the body's shape
    assert refused_field(400, VLLM_400, ()) is None  # not a field the gateway added: the client's answer


def test_other_refusals_are_the_clients() -> None:
    added = ("priority", "continuous_usage_stats")
    too_long = orjson.dumps({"error": {"message": "This model's maximum context length is 8 tokens.", "param": "max_tokens"}})
    assert refused_field(400, too_long, added) is None
    pydantic = orjson.dumps({"detail": "continuous_usage_stats: Extra inputs are not permitted"})
    assert refused_field(400, pydantic, added) == "continuous_usage_stats"
    assert refused_field(400, b"not json", added) is None
    assert added_fields(get_kind("vllm"), count_tokens=True) == ("priority", "continuous_usage_stats",
                                                                 "return_token_ids")
    assert added_fields(get_kind("sim"), count_tokens=True) == ("return_token_ids",)


def test_a_dropped_field_is_never_sent_not_even_the_clients() -> None:
    body = {"model": "m", "priority": -100}
    assert translate_body("vllm", body, 1, frozenset({"priority"})) == {"model": "m"}
    assert translate_body("vllm", {"model": "m"}, 1, frozenset({"priority"})) is None
    b = BackendConfig(name="a", url="http://h:1", kind="vllm")
    sent = orjson.loads(upstream_body(b"", {"model": "m"}, client_stream=False, client_usage=False, body_changed=False,
                                      backend=b, rank=1, count_tokens=True,
                                      dropped=frozenset({"priority", "continuous_usage_stats", "return_token_ids"})))
    assert sent == {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


def test_refusals_are_learned_once_per_backend_and_field() -> None:
    r = Refusals()
    assert r.learn("a", "priority") and not r.learn("a", "priority")
    assert r.dropped("a") == {"priority"} and r.dropped("b") == frozenset()
