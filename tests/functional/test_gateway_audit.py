"""The audit trail of real `tailguard serve` processes in front of a real simulator: every request
(the openai and anthropic SDKs', a batch's lines), every admin action (reads of usage and config,
a reload and a rollback with the settings they changed, batch create, cancel and retry) and every
auth failure is in it; `tailguard audit verify` passes, and fails naming the entry once one line
of the store is edited. The same with PostgreSQL behind two replicas, each its own chain. And a
full queue: entries dropped with a gap entry, or requests refused."""

from __future__ import annotations

import asyncio
import io
import re
import signal
import sqlite3
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import psycopg
import yaml

from tailguard.sim.server import running_sim
from tests.functional.gateway_processes import GatewayProcess, gateway_process, replicas
from tests.functional.gateways import engine, gateway
from tests.functional.postgres_server import postgres_server

CHAT = [{"role": "user", "content": "hello, I am jane.doe@example.com"}]
KEYS = {"sk-team-secret-1": {"name": "team"}}
ADMIN = "sk-admin-secret-2"
SCALE = 0.05


async def tailguard(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tailguard", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def stopped(gw: GatewayProcess) -> None:
    """SIGTERM, as a deployment stops it: the trail's last entries are written."""
    gw.proc.send_signal(signal.SIGTERM)
    assert await gw.proc.wait() == 0


def config(sim_url: str, **audit: Any) -> dict[str, Any]:
    return {"access_log": False, "log_format": "json",
            "auth": {"api_keys": KEYS, "admin_keys": [ADMIN]},
            "classes": [{"name": "interactive", "rank": 0}, {"name": "batch", "rank": 1, "preemptible": True}],
            "backends": [{"name": "sim", "url": sim_url, "kind": "sim", "max_concurrency": 4}],
            "audit": {"enabled": True, **audit}}


async def get(url: str, path: str, key: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}{path}", headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json()


async def post(url: str, path: str, key: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", json=body,
                                                    headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json()


async def requests_of_every_kind(url: str) -> set[str]:
    """A chat (whole and streamed), a completion, an Anthropic message, and two refused keys: the
    ids the trail must hold."""
    ids = set()
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-team-secret-1", max_retries=0) as c:
        await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4, extra_headers={"X-Request-Id": "r-chat"})
        stream = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4, stream=True,
                                                 extra_headers={"X-Request-Id": "r-stream"})
        async for _ in stream:
            pass
        await c.completions.create(model="tailguard-sim", prompt="hi", max_tokens=4, extra_headers={"X-Request-Id": "r-text"})
        ids |= {"r-chat", "r-stream", "r-text"}
    async with anthropic.AsyncAnthropic(base_url=url, api_key="sk-team-secret-1", max_retries=0) as a:
        await a.messages.create(model="tailguard-sim", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                extra_headers={"X-Request-Id": "r-messages"})
        ids.add("r-messages")
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-wrong-key-3", max_retries=0) as bad:
        try:
            await bad.chat.completions.create(model="tailguard-sim", messages=CHAT, extra_headers={"X-Request-Id": "r-badkey"})
        except openai.AuthenticationError:
            ids.add("r-badkey")
        try:
            await bad.models.list()
        except openai.AuthenticationError:
            pass
    return ids


async def batch_actions(url: str) -> None:
    """A batch made, cancelled while its lines run, and retried."""
    line = {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "tailguard-sim", "messages": CHAT, "max_tokens": 3000}}
    data = b"".join(orjson.dumps({"custom_id": f"l{i}", **line}) + b"\n" for i in range(2))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-team-secret-1", max_retries=0) as c:
        f = await c.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        async with asyncio.timeout(30):
            while (await c.batches.retrieve(b.id)).status == "validating":
                await asyncio.sleep(0.05)
        await c.batches.cancel(b.id)
        async with asyncio.timeout(60):
            while (await c.batches.retrieve(b.id)).status != "cancelled":
                await asyncio.sleep(0.1)
        status, body = await post(url, f"/v1/batches/{b.id}/retry", "sk-team-secret-1", {})
        assert status == 200, body
        await c.batches.cancel(body["id"])


async def admin_actions(url: str, path: Path) -> None:
    assert (await get(url, "/admin/usage", ADMIN))[0] == 200
    assert (await get(url, "/admin/config", ADMIN))[0] == 200
    assert (await get(url, "/admin/usage", "sk-team-secret-1"))[0] == 403  # a client key: an auth failure
    cfg = yaml.safe_load(path.read_text())
    cfg["classes"][1]["max_tokens_cap"] = 1234
    path.write_text(yaml.safe_dump(cfg))
    status, body = await post(url, "/admin/reload", ADMIN, {})
    assert status == 200 and body["ok"], body
    status, body = await post(url, "/admin/rollback", ADMIN, {"to": 1})
    assert status == 200 and body["ok"], body


def exported(out: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.splitlines() if line.startswith("{")]


async def test_every_request_admin_action_and_auth_failure_is_in_a_trail_that_verifies(tmp_path: Path) -> None:
    async with asyncio.timeout(180), running_sim(engine(), time_scale=SCALE) as sim:
        async with gateway_process(tmp_path, config(sim.url, retain_text=True)) as gw:
            ids = await requests_of_every_kind(gw.url)
            await admin_actions(gw.url, tmp_path / "tailguard.yaml")
            await batch_actions(gw.url)
            await stopped(gw)
        head = re.search(r'"chain": ?"([^"]+)", ?"seq": ?(\d+), ?"hash": ?"([0-9a-f]{64})"', "".join(gw.lines))
        assert head is not None, "the chain's head is logged at shutdown"
        state = str(tmp_path / "state")
        code, out = await tailguard("audit", "verify", "--state-dir", state, "--head", ":".join(head.groups()))
        assert code == 0 and out.rstrip().endswith(": ok"), out
        code, out = await tailguard("audit", "export", "--state-dir", state)
        entries = exported(out)
    kinds = [e["kind"] for e in entries]
    assert kinds[0] == "start" and "gap" not in kinds
    by_id = {e.get("request_id"): e for e in entries if e["kind"] in ("request", "auth_failure")}
    assert ids <= set(by_id)
    chat = by_id["r-chat"]
    assert (chat["caller"], chat["class"], chat["route"], chat["status"], chat["outcome"]) == (
        "team", "interactive", "/v1/chat/completions", 200, "success")
    assert chat["key"].startswith("key:") and chat["prompt_tokens"] > 0 and chat["output_tokens"] == 4
    assert "[EMAIL]" in chat["prompt"] and "jane.doe" not in out  # retained, redacted
    assert chat["completion"].startswith(" tok")  # a non-stream answer's text too
    assert by_id["r-messages"]["route"] == "/v1/messages"
    assert (by_id["r-badkey"]["kind"], by_id["r-badkey"]["status"]) == ("auth_failure", 401)
    assert by_id["r-badkey"]["key"] != chat["key"]  # the wrong key, fingerprinted
    failures = [(e["route"], e["status"]) for e in entries if e["kind"] == "auth_failure"]
    assert ("/v1/models", 401) in failures and ("/admin/usage", 403) in failures
    actions = {e["action"]: e for e in entries if e["kind"] == "admin"}
    assert {"read_usage", "read_config", "reload", "rollback", "batch_create", "batch_cancel", "batch_retry"} <= set(actions)
    assert "classes[batch].max_tokens_cap" in actions["reload"]["changed"]
    assert "classes[batch].max_tokens_cap" in actions["rollback"]["changed"] and actions["rollback"]["ok"]
    assert actions["reload"]["key"] == actions["read_usage"]["key"] != chat["key"]
    lines = [e for e in entries if e["kind"] == "request" and e["route"] == "/v1/chat/completions"
             and e["class"] == "batch"]
    assert lines, "a batch's lines are requests of the trail too"
    db = b"".join(p.read_bytes() for p in (tmp_path / "state").glob("audit.sqlite3*"))
    assert b"sk-team-secret-1" not in db and b"sk-admin-secret-2" not in db and b"sk-wrong-key-3" not in db

    # One line edited in the store: verify names it.
    seq = next(e["seq"] for e in entries if e.get("request_id") == "r-chat")
    with sqlite3.connect(tmp_path / "state" / "audit.sqlite3") as db_conn:
        db_conn.execute("UPDATE audit_entries SET doc = replace(doc, '\"status\":200', '\"status\":500') WHERE seq = ?",
                        (seq,))
    code, out = await tailguard("audit", "verify", "--state-dir", str(tmp_path / "state"))
    assert code == 1 and f"entry {seq}: its hash does not match its content (edited)" in out, out
    # ... and a caller's own export is theirs alone.
    code, out = await tailguard("audit", "export", "--state-dir", str(tmp_path / "state"), "--caller", "team")
    assert code == 0 and {e["caller"] for e in exported(out)} == {"team"}


async def test_two_replicas_append_their_own_chains_to_one_postgresql_table(tmp_path: Path) -> None:
    async with asyncio.timeout(180), AsyncExitStack() as stack:
        url = stack.enter_context(postgres_server())
        sim = await stack.enter_async_context(running_sim(engine(), time_scale=SCALE))
        gws = await replicas(stack, tmp_path, config(sim.url, store=url), n=2)
        ids = set()
        for i, gw in enumerate(gws):
            async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-team-secret-1", max_retries=0) as c:
                for k in range(3):
                    rid = f"r{i}-{k}"
                    await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4,
                                                    extra_headers={"X-Request-Id": rid})
                    ids.add(rid)
            assert (await get(gw.url, "/admin/usage", ADMIN))[0] == 200
            assert (await get(gw.url, "/admin/usage", "sk-team-secret-1"))[0] == 403
            status, body = await post(gw.url, "/admin/reload", ADMIN, {})
            assert status == 200 and body["ok"], body
        for gw in gws:
            await stopped(gw)
        code, out = await tailguard("audit", "verify", "--store", url)
        assert code == 0 and out.count(": ok") == 2, out
        code, out = await tailguard("audit", "export", "--store", url)
        entries = exported(out)
        assert ids <= {e.get("request_id") for e in entries}
        chains = {e["chain"] for e in entries}
        assert len(chains) == 2
        for action in ("read_usage", "reload"):
            assert {e["chain"] for e in entries if e.get("action") == action} == chains
        assert {e["chain"] for e in entries if e["kind"] == "auth_failure"} == chains
        victim = next(e for e in entries if e.get("request_id") == "r1-1")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE audit_entries SET doc = replace(doc, '\"output_tokens\":4', '\"output_tokens\":1') "
                         "WHERE chain = %s AND seq = %s", (victim["chain"], victim["seq"]))
        code, out = await tailguard("audit", "verify", "--store", url)
        assert code == 1, out
        assert f"chain {victim['chain']} entry {victim['seq']}: its hash does not match its content" in out
        assert out.count(": ok") == 1  # the other replica's chain is intact


async def test_a_full_queue_drops_with_a_gap_or_refuses(tmp_path: Path) -> None:
    slow = {"enabled": True, "queue_entries": 10, "flush_s": 10.0}  # the writer wakes once in 10 s
    async with asyncio.timeout(60):
        async with gateway(audit={**slow, "path": str(tmp_path / "a.sqlite3"), "when_full": "refuse"}) as gw:
            client = gw.client()
            statuses = []
            for _ in range(12):
                try:
                    await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
                    statuses.append(200)
                except openai.InternalServerError as e:
                    assert e.code == "audit_unavailable" and e.response.headers["retry-after"] == "1"
                    statuses.append(e.status_code)
            await client.close()
        assert statuses[:9] == [200] * 9 and 503 in statuses  # the start entry and nine requests fill it
        async with gateway(audit={**slow, "path": str(tmp_path / "b.sqlite3")}) as gw:
            client = gw.client()
            for _ in range(12):
                await client.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
            await client.close()
        code, out = await tailguard("audit", "verify", "--store", str(tmp_path / "b.sqlite3"))
        assert code == 0, out
        code, out = await tailguard("audit", "export", "--store", str(tmp_path / "b.sqlite3"))
        entries = exported(out)
        assert [e["kind"] for e in entries].count("request") == 9
        assert entries[-1]["kind"] == "gap" and entries[-1]["dropped"] == 3

