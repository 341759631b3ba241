"""Nothing secret leaves the gateway: a run with client keys (named and not) and a backend key,
against a backend whose error answers echo what it was sent (its own credentials included), then
every log line, the metrics page, `/health`, `/config`, every error body and a config error are
searched for every configured secret."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import orjson
import pytest

from tailguard.errors import ConfigError
from tailguard.config import BackendConfig, load_config
from tests.functional.gateways import gateway
from tests.functional.raw_servers import raw_server, read_request

CLIENT_UNNAMED = "sk-unnamed-7d1c93ab55"
CLIENT_NAMED = "sk-named-0e6f2a4d88"
BACKEND_KEY = "bk-backend-5a3e9c1f77"
SECRETS = (CLIENT_UNNAMED, CLIENT_NAMED, BACKEND_KEY)


async def _echoing(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """A backend whose errors say what it got, as a debug traceback would: a 400 (OpenAI's shape)
    for a body asking for `four`, else a 500; probes get a 200."""
    while True:
        req = await read_request(r)
        if req.startswith(b"GET"):
            status, body = b"200 OK", b'{"object":"list","data":[]}'
        elif b"four" in req:
            status = b"400 Bad Request"
            body = orjson.dumps({"error": {"message": f"bad request; you sent {req.decode()}",
                                           "type": "invalid_request_error", "code": "bad_thing"}})
        else:
            status, body = b"500 Internal Server Error", b"Traceback (most recent call last):\n" + req
        w.write(b"HTTP/1.1 %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                % (status, len(body), body))
        await w.drain()


async def test_no_configured_secret_appears_in_logs_metrics_or_errors(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    auth = {"api_keys": {CLIENT_UNNAMED: {}, CLIENT_NAMED: {"name": "app"}}}
    async with asyncio.timeout(30), raw_server(_echoing) as url:
        backend = BackendConfig(name="echo", url=url, kind="openai", api_key=BACKEND_KEY)
        async with gateway(sims=0, extra_backends=[backend], auth=auth, retries={"max_attempts": 1}) as gw, \
                aiohttp.ClientSession() as s:
            for key, content in ((CLIENT_UNNAMED, "hi"), (CLIENT_NAMED, "four"), ("sk-wrong", "hi"), (None, "hi")):
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                body = {"model": "tailguard-sim", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
                async with s.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r:
                    seen.append(f"{r.status} {dict(r.headers)} {await r.text()}")
            statuses = [int(t.split()[0]) for t in seen]
            assert statuses == [502, 400, 401, 401]
            assert '"code":"bad_thing"' in seen[1]  # the 4xx's code and a cut, blanked message go on
            for path in ("/metrics", "/health", "/config", "/v1/models"):
                async with s.get(gw.url + path, headers={"Authorization": f"Bearer {CLIENT_NAMED}"}) as r:
                    seen.append(await r.text())
            assert 'caller="key:' in seen[4]  # the unnamed key's caller, by its keyed fingerprint
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"auth: {{api_keys: {{{CLIENT_UNNAMED}: {{rpm_limit: 0}}}}}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert "rpm_limit" in str(info.value)
    seen.append(str(info.value))
    seen += [rec.getMessage() + str(rec.exc_info or "") for rec in caplog.records]
    for text in seen:
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} in {text[:300]!r}"
