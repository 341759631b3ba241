"""Keys that say what they may use, tokens reserved as requests are let in, and the operator
routes behind an admin key, through the real gateway in front of the real simulator with the real
`openai` client: a batch-only key cannot get interactive (refused or lowered), a key is held to
its models, a key stored as its SHA-256 works, concurrent requests never spend past `tpm_limit`,
`max_parallel_requests` holds, and `/config`, `/metrics` and `/admin/*` answer only an admin key."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from tailguard.config import GatewayConfig
from tailguard.gateway.http.app import _started, create_app, gateway_runner, reloader_of
from tailguard.gateway.http.admin import ADMIN
from tailguard.gateway.http.keys import LIVE
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.store import ConfigStore
from tailguard.sim.server import running_sim
from tests.functional.gateways import classes, engine, gateway, until
from tests.servers import running

CHAT = [{"role": "user", "content": "hi"}]
ADMIN_KEY = "adm-0123456789abcdef"
HASHED = "sk-stored-as-its-hash"
KEYS: dict[str, Any] = {
    "sk-batch": {"name": "nightly", "default_class": "batch", "allowed_classes": ["batch"]},
    "sk-lower": {"name": "lowered", "allowed_classes": ["batch"], "on_disallowed_class": "lower"},
    "sk-m": {"name": "m-only", "allowed_models": ["tailguard-sim"]},
    "sha256:" + hashlib.sha256(HASHED.encode()).hexdigest(): {"name": "hashed"},
}
BATCH_CAP = 8


def client(url: str, key: str, **kw: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, **kw)


async def test_a_batch_only_key_cannot_get_interactive_and_a_key_is_held_to_its_models() -> None:
    auth = {"api_keys": KEYS, "admin_keys": [ADMIN_KEY]}
    async with asyncio.timeout(30), gateway(auth=auth, classes=classes(batch={"max_tokens_cap": BATCH_CAP})) as gw, \
            client(gw.url, "sk-batch") as batch, client(gw.url, "sk-lower") as lower, \
            client(gw.url, "sk-m") as m_only, client(gw.url, HASHED) as hashed:
        for asked in ({"extra_headers": {"X-Tailguard-Class": "interactive"}}, {"service_tier": "priority"}):
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await batch.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=50, **asked)
            assert refused.value.status_code == 403 and refused.value.code == "class_not_allowed"
        raw = await batch.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=50)
        assert raw.headers["x-tailguard-class"] == "batch" and raw.parse().usage.completion_tokens <= BATCH_CAP

        raw = await lower.chat.completions.with_raw_response.create(  # lowered: batch, and batch's cap
            model="tailguard-sim", messages=CHAT, max_tokens=50, extra_headers={"X-Tailguard-Class": "interactive"})
        assert raw.headers["x-tailguard-class"] == "batch" and raw.parse().usage.completion_tokens <= BATCH_CAP

        assert (await m_only.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)).choices
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await m_only.chat.completions.create(model="other", messages=CHAT, max_tokens=1)
        assert refused.value.code == "model_not_allowed"
        with pytest.raises(openai.BadRequestError) as missing:  # no model named: not "may not use model None"
            await m_only.post("/chat/completions", cast_to=object, body={"messages": CHAT, "max_tokens": 1})
        assert missing.value.code == "missing_required_parameter" and "None" not in missing.value.message

        assert (await hashed.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)).choices
        async with client(gw.url, "sha256:" + hashlib.sha256(HASHED.encode()).hexdigest()) as digest_as_key:
            with pytest.raises(openai.AuthenticationError):  # the digest is not the key
                await digest_as_key.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
        async with client(gw.url, "k" * 5000) as huge:
            with pytest.raises(openai.AuthenticationError):  # refused before it is hashed
                await huge.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)


async def test_a_key_sees_only_the_models_it_may_use() -> None:
    """`/v1/models` and `/v1/models/{id}` answer a key limited to some models as if the others did
    not exist (OpenAI's 404 for a model an organisation cannot access); an unlimited key sees all."""
    keys = {"sk-fast": {"name": "fast-only", "allowed_models": ["fast"]}, "sk-all": {"name": "all"}}
    async with asyncio.timeout(30), gateway(auth={"api_keys": keys}, aliases={"fast": "tailguard-sim"}) as gw, \
            client(gw.url, "sk-fast") as fast, client(gw.url, "sk-all") as every:
        assert sorted([m.id async for m in every.models.list()]) == ["fast", "tailguard-sim"]
        assert [m.id async for m in fast.models.list()] == ["fast"]
        assert (await fast.models.retrieve("fast")).id == "fast"
        with pytest.raises(openai.NotFoundError) as hidden:
            await fast.models.retrieve("tailguard-sim")
        assert hidden.value.code == "model_not_found" and "tailguard-sim" not in hidden.value.message.split("Served")[1]
        assert (await every.models.retrieve("tailguard-sim")).id == "tailguard-sim"


async def test_concurrent_requests_never_spend_past_the_token_limit() -> None:
    """20 concurrent requests of up to 200 tokens against `tpm_limit: 1000`: charged at the end,
    all 20 ran (4,000+ tokens); reserved on arrival, what is let in fits the bucket."""
    keys = {"sk-app": {"name": "app", "tpm_limit": 1000}}
    async with asyncio.timeout(30), gateway(auth={"api_keys": keys}) as gw, client(gw.url, "sk-app") as app:
        async def one() -> tuple[int, int]:
            try:
                raw = await app.chat.completions.with_raw_response.create(model="tailguard-sim", messages=CHAT, max_tokens=200)
            except openai.RateLimitError as e:
                assert e.type == "tokens" and int(e.response.headers["retry-after-ms"]) > 0
                return 429, 0
            usage = raw.parse().usage
            assert usage is not None
            return 200, usage.prompt_tokens + usage.completion_tokens
        results = await asyncio.gather(*(one() for _ in range(20)))
    served = [used for status, used in results if status == 200]
    assert 1 <= len(served) <= 5 and results.count((429, 0)) == 20 - len(served)
    assert sum(served) <= 1000  # each reserved its prompt + 200 before it ran


async def test_max_parallel_requests_holds_while_streams_run() -> None:
    keys = {"sk-app": {"name": "app", "max_parallel_requests": 2}}
    async with asyncio.timeout(30), gateway(auth={"api_keys": keys}, scale=0.2) as gw, \
            client(gw.url, "sk-app") as app:
        streams = [await app.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4000, stream=True)
                   for _ in range(2)]
        for s in streams:
            await anext(aiter(s))  # both run
        with pytest.raises(openai.RateLimitError) as over:
            await app.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)
        assert over.value.response.headers["x-tailguard-reject-reason"] == "rate_limit_parallel"
        await streams[0].close()

        async def let_in() -> bool:
            try:
                return bool((await app.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=1)).choices)
            except openai.RateLimitError:
                return False
        await until(let_in, step_s=0.02)  # one closed: one more may go
        await streams[1].close()


async def get(s: aiohttp.ClientSession, url: str, key: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with s.get(url, headers=headers) as r:
        return r.status, await r.text()


async def test_operator_routes_answer_only_an_admin_key(tmp_path: Path) -> None:
    auth = {"api_keys": {"sk-app": {"name": "app"}}, "admin_keys": [ADMIN_KEY], "open_metrics": "keys"}
    async with asyncio.timeout(60), gateway(auth=auth) as gw, aiohttp.ClientSession() as s, \
            client(gw.url, "sk-app") as app:
        assert (await app.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=3)).choices
        for path in ("/config", "/admin/config", "/metrics", "/admin/usage"):
            assert (await get(s, gw.url + path, None))[0] == 401
            assert (await get(s, gw.url + path, "sk-app"))[0] == 403
            status, text = await get(s, gw.url + path, ADMIN_KEY)
            assert status == 200 and ADMIN_KEY not in text and "sk-app" not in text
        assert (await get(s, gw.url + "/health", None))[0] == 200

        status, text = await get(s, gw.url + "/admin/usage?caller=app", ADMIN_KEY)
        rows = orjson.loads(text)["data"]
        assert [(r["caller"], r["class"], r["requests"], r["output_tokens"]) for r in rows] == [
            ("app", "interactive", 1, 3)]

        head = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with s.post(gw.url + "/admin/reload", headers=head) as r:
            assert r.status == 409  # not started by `tailguard serve`: nothing to reload from
        changed = gw.app[LIVE].cfg.model_dump()
        changed["auth"]["api_keys"]["sk-app"]["rpm_limit"] = 100
        new = GatewayConfig.model_validate(changed)
        gw.app[ADMIN].reloader = reloader_of(gw.app, ConfigStore(tmp_path / "state"), lambda: new)
        async with s.post(gw.url + "/admin/reload", headers=head, json={}) as r:
            result = await r.json()
            assert r.status == 200 and result["ok"] and result["hash"] == new.digest()
        assert gw.app[LIVE].cfg.auth.api_keys["sk-app"].rpm_limit == 100
        async with s.post(gw.url + "/admin/rollback", headers=head, json={"to": "x"}) as r:
            assert r.status == 400
        async with s.post(gw.url + "/admin/reload", headers={"Authorization": "Bearer sk-app"}) as r:
            assert r.status == 403

        statuses = [(await get(s, gw.url + "/admin/config", None))[0] for _ in range(650)]
        assert statuses.count(429) >= 1 and statuses[0] == 401  # a guesser is slowed down too


async def test_metrics_stay_open_on_loopback_by_default() -> None:
    auth = {"api_keys": {"sk-app": {"name": "app"}}}
    async with asyncio.timeout(30), gateway(auth=auth) as gw, aiohttp.ClientSession() as s:
        assert (await get(s, gw.url + "/metrics", None))[0] == 200
        assert (await get(s, gw.url + "/config", "sk-app"))[0] == 403  # no admin key configured: nobody


async def test_without_keys_the_admin_routes_answer_loopback_only(caplog: pytest.LogCaptureFixture) -> None:
    """No key at all: `/admin/*` (reload, rollback, everyone's usage) from an address the gateway
    does not count as loopback (127.0.0.2, its other addresses alike) is 403, from 127.0.0.1 it
    answers; `/config` and `/metrics` stay open. Listening beyond loopback says so at start."""
    async with asyncio.timeout(30), gateway() as gw, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))) as elsewhere, \
            aiohttp.ClientSession() as here:
        for path in ("/admin/usage", "/admin/config"):
            status, text = await get(elsewhere, gw.url + path, None)
            assert status == 403 and "admin_key_required" in text
            assert (await get(here, gw.url + path, None))[0] == 200
        async with elsewhere.post(gw.url + "/admin/reload") as r:
            assert r.status == 403
        for path in ("/config", "/metrics", "/health"):
            assert (await get(elsewhere, gw.url + path, None))[0] == 200
    caplog.set_level(logging.WARNING, logger="tailguard.gateway")
    cfg = GatewayConfig.model_validate({"host": "0.0.0.0", "backends": [{"name": "a", "url": "http://127.0.0.1:9"}]})
    _started(cfg, Live.of(cfg), "http://0.0.0.0:8000")
    _started(cfg.model_copy(update={"host": "127.0.0.1"}), Live.of(cfg), "http://127.0.0.1:8000")
    said = [r.getMessage() for r in caplog.records if "no API keys" in r.getMessage()]
    assert len(said) == 1 and "answer loopback clients only" in said[0]


PROMPT_MARK = "zebra-umbrella-4417"  # a prompt's text, to look for in the logs


async def test_no_key_and_no_prompt_text_in_any_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """Every way a request can go (served, streamed then dropped, refused 401/403/429, admin routes
    allowed and refused), then every log record of the run, with all its fields, is searched."""
    caplog.set_level(logging.DEBUG)
    keys = {**KEYS, "sk-limited-5c1d": {"name": "limited", "rpm_limit": 1}}
    auth = {"api_keys": keys, "admin_keys": [ADMIN_KEY], "open_metrics": "keys"}
    chat = [{"role": "user", "content": f"tell me about {PROMPT_MARK}"}]
    secrets = [k for k in keys if not k.startswith("sha256:")] + [ADMIN_KEY, HASHED, "sk-unknown-77aa"]
    async with asyncio.timeout(30), gateway(auth=auth, access_log=True) as gw, aiohttp.ClientSession() as s:
        async with client(gw.url, "sk-batch") as batch, client(gw.url, HASHED) as hashed, \
                client(gw.url, "sk-limited-5c1d") as limited, client(gw.url, "sk-unknown-77aa") as unknown, \
                client(gw.url, "sk-m") as m_only:
            assert (await hashed.chat.completions.create(model="tailguard-sim", messages=chat, max_tokens=3)).choices
            stream = await hashed.chat.completions.create(model="tailguard-sim", messages=chat, max_tokens=500, stream=True)
            await anext(aiter(stream))
            await stream.close()
            for call, error in ((batch.chat.completions.create(model="tailguard-sim", messages=chat, max_tokens=3,
                                                               service_tier="priority"), openai.PermissionDeniedError),
                                (m_only.chat.completions.create(model="x", messages=chat), openai.PermissionDeniedError),
                                (unknown.chat.completions.create(model="tailguard-sim", messages=chat), openai.AuthenticationError)):
                with pytest.raises(error):
                    await call
            await limited.chat.completions.create(model="tailguard-sim", messages=chat, max_tokens=1)
            with pytest.raises(openai.RateLimitError):
                await limited.chat.completions.create(model="tailguard-sim", messages=chat, max_tokens=1)
        for key in (ADMIN_KEY, "sk-batch", "sk-unknown-77aa", None):
            for path in ("/admin/config", "/admin/usage", "/metrics"):
                await get(s, gw.url + path, key)
    # The access log was captured: its lines name callers, by name.
    assert any("hashed" in rec.getMessage() for rec in caplog.records)
    assert any("class_not_allowed" in rec.getMessage() for rec in caplog.records)
    for rec in caplog.records:
        text = rec.getMessage() + repr(rec.__dict__)
        assert PROMPT_MARK not in text, text[:300]
        for secret in secrets:
            assert secret not in text, f"{secret!r} in {text[:300]!r}"


async def test_usage_per_caller_survives_a_restart_of_the_gateway(tmp_path: Path) -> None:
    """Two runs of a gateway on one state directory: what the first served, and what it refused,
    is at `/admin/usage` in the second."""
    auth = {"api_keys": {"sk-app": {"name": "app", "rpm_limit": 2}, "sk-web": {"name": "web"}},
            "admin_keys": [ADMIN_KEY]}
    head = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with asyncio.timeout(30), running_sim(engine(), time_scale=0.02) as sim:
        cfg = GatewayConfig.model_validate({"auth": auth, "backends": [{"name": "sim", "url": sim.url, "kind": "sim"}]})
        app = create_app(cfg, state_dir=tmp_path / "state")
        async with running(app, runner=gateway_runner(app)) as url, client(url, "sk-app") as c, \
                client(url, "sk-web") as w:
            for _ in range(2):
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
            with pytest.raises(openai.RateLimitError):
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
            await w.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2, extra_headers={
                "X-Tailguard-Class": "batch"})
        app = create_app(cfg, state_dir=tmp_path / "state")  # the same directory, a new process's state
        async with running(app, runner=gateway_runner(app)) as url, aiohttp.ClientSession() as s:
            async with s.get(f"{url}/admin/usage", headers=head) as r:
                rows = (await r.json())["data"]
    got = {(r["caller"], r["class"]): (r["requests"], r["output_tokens"], r["rejections"]) for r in rows}
    assert got == {("app", "interactive"): (3, 8, {"rate_limit_requests": 1}), ("web", "batch"): (1, 2, {})}
