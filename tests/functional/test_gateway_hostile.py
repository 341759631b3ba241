"""Malformed, oversized and hostile requests over real loopback sockets: each gets a clear 4xx
with OpenAI's error body (or is served, when it is valid after all), is counted once, holds no
queue entry or slot, and the gateway serves a normal request right after."""

from __future__ import annotations

import asyncio
import gzip
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import orjson
import pytest

from tests.functional.gateways import Stack, gateway, health, sample, scrape

CHAT = [{"role": "user", "content": "hello"}]
JSON = {"Content-Type": "application/json"}
LIMIT = 256 * 1024  # max_body_bytes of these gateways: room for 100,000 nested lists


def chat(**kw: Any) -> bytes:
    return orjson.dumps({"model": "tailguard-sim", "messages": CHAT, "max_tokens": 2, **kw})


def _with(field: str, literal: bytes) -> bytes:
    """A chat body whose `field` is the JSON text `literal` (for numbers Python cannot write as such)."""
    return b'{"model":"m","messages":[{"role":"user","content":"hi"}],"' + field.encode() + b'":' + literal + b"}"


async def _post(
    url: str, body: bytes, headers: dict[str, str], path: str = "chat/completions",
    session: aiohttp.ClientSession | None = None,
) -> tuple[int, Any]:
    async with AsyncExitStack() as stack:
        s = session or await stack.enter_async_context(aiohttp.ClientSession())
        async with s.post(f"{url}/v1/{path}", data=body, headers=headers) as r:
            return r.status, orjson.loads(await r.read())


async def _still_serves_and_counted_once(
    gw: Stack, *, failures: int, successes: int = 0, session: aiohttp.ClientSession | None = None,
) -> None:
    """A normal request succeeds (on `session`, the hostile request's own, when given: its
    connection was either kept usable or closed with `Connection: close`); `tailguard_requests_total`
    holds exactly the requests sent (`successes` before it, and `failures` that did not succeed),
    and nothing is left queued or in flight."""
    status, body = await _post(gw.url, chat(), JSON, session=session)
    assert status == 200 and body["choices"][0]["message"]["content"] == " tok tok"
    m = await scrape(gw.url)
    total = {labels: v for (name, labels), v in m.items() if name == "tailguard_requests_total"}
    ok = sum(v for labels, v in total.items() if ("outcome", "success") in labels)
    assert ok == successes + 1
    # Refused before it had a class: counted once too, by status alone.
    unclassified = sum(v for (name, _), v in m.items() if name == "tailguard_unclassified_requests_total")
    assert sum(total.values()) - ok + unclassified == failures
    h = await health(gw.url)
    assert h["queued"] == 0 and all(b["in_flight"] == 0 for b in h["backends"].values())


def _assert_openai_error(err: Any, code: str, param: str | None) -> None:
    assert set(err) == {"error"} and set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["code"] == code and err["error"]["param"] == param and err["error"]["message"]
    assert err["error"]["type"] == "invalid_request_error"


REFUSED = [
    ("non-utf-8", b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}', None, 400, "invalid_json", None),
    ("json string", b'"hi"', None, 400, "invalid_json", None),
    ("json number", b"42", None, 400, "invalid_json", None),
    ("json null", b"null", None, 400, "invalid_json", None),
    ("no body", b"", None, 400, "invalid_json", None),
    ("100000 nested lists", b"[" * 100_000 + b"]" * 100_000, None, 400, "invalid_json", None),
    ("deep field", _with("x", b"[" * 20_000 + b"]" * 20_000), None, 400, "invalid_json", None),
    ("max_tokens -1", chat(max_tokens=-1), None, 400, "invalid_value", "max_tokens"),
    ("max_tokens 0", chat(max_tokens=0), None, 400, "invalid_value", "max_tokens"),
    ("max_tokens 1.5", chat(max_tokens=1.5), None, 400, "invalid_type", "max_tokens"),
    ("max_tokens true", chat(max_tokens=True), None, 400, "invalid_type", "max_tokens"),
    ("max_tokens 1e18", _with("max_tokens", b"1e18"), None, 400, "invalid_type", "max_tokens"),
    ("max_tokens 10**18", chat(max_tokens=10**18), None, 400, "invalid_value", "max_tokens"),
    ("mct -1", chat(max_completion_tokens=-1), None, 400, "invalid_value", "max_completion_tokens"),
    ("mct 0", chat(max_completion_tokens=0), None, 400, "invalid_value", "max_completion_tokens"),
    ("mct 1.5", chat(max_completion_tokens=1.5), None, 400, "invalid_type", "max_completion_tokens"),
    ("mct false", chat(max_completion_tokens=False), None, 400, "invalid_type", "max_completion_tokens"),
    ("mct 1e18", _with("max_completion_tokens", b"1e18"), None, 400, "invalid_type", "max_completion_tokens"),
    ("mct 10**18", chat(max_completion_tokens=10**18), None, 400, "invalid_value", "max_completion_tokens"),
    ("mct hides a bad max_tokens", chat(max_completion_tokens=2, max_tokens="9"), None, 400, "invalid_type",
     "max_tokens"),
    ("n 0", chat(n=0), None, 400, "invalid_value", "n"),
    ("n -1", chat(n=-1), None, 400, "invalid_value", "n"),
    ("n huge", chat(n=10**9), None, 400, "invalid_value", "n"),
    ("n 2 stream (the engine refuses)", chat(n=2, stream=True), None, 400, "invalid_value", "n"),
    ("messages empty", chat(messages=[]), None, 400, "invalid_type", "messages"),
    ("message without role", chat(messages=[{"content": "x"}]), None, 400, "invalid_value", "messages[0].role"),
    ("stream_options string", chat(stream=True, stream_options="x"), None, 400, "invalid_type", "stream_options"),
    ("include_usage string", chat(stream=True, stream_options={"include_usage": "yes"}), None, 400, "invalid_type",
     "stream_options.include_usage"),
    ("temperature string (the engine refuses)", chat(temperature="hot"), None, 400, "invalid_type", "temperature"),
    ("text/plain", chat(), {"Content-Type": "text/plain"}, 415, "unsupported_media_type", "Content-Type"),
    ("form", chat(), {"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type",
     "Content-Type"),
    ("octet-stream", chat(), {"Content-Type": "application/octet-stream"}, 415, "unsupported_media_type",
     "Content-Type"),
    ("broken gzip", b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "invalid_body", None),
    ("gzip bomb", gzip.compress(b" " * 20_000_000), {"Content-Encoding": "gzip"}, 413, "body_too_large", None),
    ("too large", chat(messages=[{"role": "user", "content": "x" * LIMIT}]), None, 413, "body_too_large", None),
    ("long class header", chat(), {"X-Tailguard-Class": "a" * 7000}, 400, "unknown_class", "X-Tailguard-Class"),
    ("odd class header", chat(), {"X-Tailguard-Class": "b\u00e4tch\t"}, 400, "unknown_class", "X-Tailguard-Class"),
]


@pytest.mark.parametrize("body,headers,status,code,param", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
async def test_refused_with_an_openai_4xx_counted_once(
    body: bytes, headers: dict[str, str] | None, status: int, code: str, param: str | None,
) -> None:
    async with asyncio.timeout(10), gateway(max_body_bytes=LIMIT) as gw, aiohttp.ClientSession() as s:
        got, err = await _post(gw.url, body, {**JSON, **(headers or {})}, session=s)
        assert got == status, err
        _assert_openai_error(err, code, param)
        assert len(err["error"]["message"]) < 300  # a huge header or body is named, not echoed
        await _still_serves_and_counted_once(gw, failures=1, session=s)


COMPLETION = "completions"
ACCEPTED = [
    ("content as text parts", chat(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]), {},
     "chat/completions"),
    ("content null", chat(messages=[{"role": "assistant", "content": None}, {"role": "user", "content": "x"}]), {},
     "chat/completions"),
    ("duplicate keys: the last wins, as in every engine", b'{"messages":[{"role":"user","content":"a"}],'
     b'"max_tokens":9,"max_tokens":2}', {}, "chat/completions"),
    ("no Content-Type", chat(), {"Content-Type": ""}, "chat/completions"),
    ("json with charset", chat(), {"Content-Type": "application/json; charset=utf-8"}, "chat/completions"),
    ("gzip body", gzip.compress(chat()), {"Content-Encoding": "gzip"}, "chat/completions"),
    ("prompt strings", orjson.dumps({"prompt": ["a", "b"], "max_tokens": 2}), {}, COMPLETION),
    ("prompt token ids", orjson.dumps({"prompt": [1, 2, 3], "max_tokens": 2}), {}, COMPLETION),
    ("prompt empty string", orjson.dumps({"prompt": "", "max_tokens": 2}), {}, COMPLETION),
]


@pytest.mark.parametrize("body,headers,path", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
async def test_valid_if_unusual_requests_are_served(body: bytes, headers: dict[str, str], path: str) -> None:
    async with asyncio.timeout(10), gateway(max_body_bytes=LIMIT) as gw:
        h = {**JSON, **headers}
        if not h["Content-Type"]:
            del h["Content-Type"]
        async with aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as s, \
                s.post(f"{gw.url}/v1/{path}", data=body, headers=h) as r:
            assert r.status == 200
            out = orjson.loads(await r.read())
        assert out["usage"]["completion_tokens"] == 2
        await _still_serves_and_counted_once(gw, failures=0, successes=1)


async def test_an_empty_prompt_list_is_a_400() -> None:
    async with asyncio.timeout(10), gateway() as gw:
        status, err = await _post(gw.url, orjson.dumps({"prompt": [], "max_tokens": 2}), JSON, COMPLETION)
        assert status == 400
        _assert_openai_error(err, "invalid_type", "prompt")
        await _still_serves_and_counted_once(gw, failures=1)


@pytest.mark.parametrize("auth,code", [
    (None, "missing_api_key"),
    ("Bearer", "missing_api_key"),
    ("Basic c2VrcmV0", "missing_api_key"),
    ("Bearer wrong", "invalid_api_key"),
    ("Bearer sekret trailing", "invalid_api_key"),
    ("Bearer " + "k" * 8000, "invalid_api_key"),
])
async def test_bad_api_keys_are_401_before_the_body_is_read(auth: str | None, code: str) -> None:
    async with asyncio.timeout(10), gateway(max_body_bytes=LIMIT, auth={"api_keys": {"sekret": {}}}) as gw, \
            aiohttp.ClientSession() as s:
        headers = {**JSON, **({"Authorization": auth} if auth is not None else {})}
        # The body is over the limit: a stranger's body is not read, so it is a 401, not a 413.
        status, err = await _post(gw.url, b"x" * (2 * LIMIT), headers, session=s)
        assert status == 401
        assert err["error"]["code"] == code and err["error"]["type"] == "authentication_error"
        async with s.post(
            f"{gw.url}/v1/chat/completions", data=chat(), headers={**JSON, "Authorization": "bearer  sekret "},
        ) as r:
            assert r.status == 200
        m = await scrape(gw.url)
    assert sample(m, "tailguard_unclassified_requests_total", status="401") == 1
    assert sample(m, "tailguard_requests_total", **{"class": "interactive", "outcome": "success"}) == 1


async def _open(gw: Stack) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = gw.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def _head(extra: str) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{extra}\r\n"
            .encode())


async def _status(reader: asyncio.StreamReader) -> tuple[int, Any]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    return int(head.split(b" ")[1]), orjson.loads(await reader.readexactly(length))


async def test_a_declared_length_over_the_limit_is_a_413_before_any_body() -> None:
    async with asyncio.timeout(5), gateway(max_body_bytes=LIMIT) as gw:
        reader, writer = await _open(gw)
        writer.write(_head("Content-Length: 100000000\r\n"))  # and no body at all
        status, err = await _status(reader)
        writer.close()
        assert status == 413
        _assert_openai_error(err, "body_too_large", None)
        await _still_serves_and_counted_once(gw, failures=1)


async def test_a_chunked_body_over_the_limit_is_a_413_before_it_ends() -> None:
    async with asyncio.timeout(5), gateway(max_body_bytes=LIMIT) as gw:
        reader, writer = await _open(gw)
        writer.write(_head("Transfer-Encoding: chunked\r\n"))
        chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
        for _ in range(LIMIT // 0x4000 + 1):
            writer.write(chunk)
        await writer.drain()
        status, err = await _status(reader)  # the body has not ended: no terminating chunk was sent
        writer.close()
        assert status == 413
        _assert_openai_error(err, "body_too_large", None)
        await _still_serves_and_counted_once(gw, failures=1)


async def test_a_body_that_stalls_is_a_408_and_holds_no_slot() -> None:
    body = chat()
    async with asyncio.timeout(5), gateway(max_body_bytes=LIMIT, body_timeout_s=0.2, max_concurrency=1) as gw:
        reader, writer = await _open(gw)
        writer.write(_head(f"Content-Length: {len(body)}\r\n") + body[:10])  # the rest never comes
        # Meanwhile the gateway's one slot serves others: the stalled body holds none.
        assert (await _post(gw.url, chat(), JSON))[0] == 200
        status, err = await _status(reader)
        writer.close()
        assert status == 408
        _assert_openai_error(err, "body_timeout", None)
        await _still_serves_and_counted_once(gw, failures=1, successes=1)


async def test_a_thousand_connections_that_open_and_close_leave_nothing_behind() -> None:
    # max_tokens far beyond what can finish: a request that got in can only end as client_gone.
    body = chat(max_tokens=100_000)
    head = _head(f"Content-Length: {len(body)}\r\n")

    async def one(i: int) -> None:
        _, writer = await _open(gw)
        writer.write(b"" if i % 3 == 0 else head + body[:10] if i % 3 == 1 else head + body)
        writer.close()
        await writer.wait_closed()

    async with asyncio.timeout(20), gateway(max_body_bytes=LIMIT) as gw:
        await asyncio.gather(*(one(i) for i in range(1000)))

        async def settled() -> bool:
            h = await health(gw.url)
            return bool(h["queued"] == 0 and h["backends"]["sim0"]["in_flight"] == 0)
        while not await settled():
            await asyncio.sleep(0.01)
        m = await scrape(gw.url)
        total = {labels: v for (name, labels), v in m.items() if name == "tailguard_requests_total"}
        assert set(dict(labels)["outcome"] for labels, v in total.items() if v) <= {"client_gone"}
        assert sum(total.values()) <= 667  # at most once each for the 667 that sent headers
        status, out = await _post(gw.url, chat(), JSON)
        assert status == 200 and out["usage"]["completion_tokens"] == 2


async def test_the_model_list_needs_the_key_too() -> None:
    async with asyncio.timeout(10), gateway(auth={"api_keys": {"sekret": {}}}) as gw, aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/v1/models") as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "missing_api_key"
        async with s.get(f"{gw.url}/v1/models", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
        async with s.get(f"{gw.url}/v1/models", headers={"Authorization": "Bearer sekret"}) as r:
            assert r.status == 200 and (await r.json())["data"]
