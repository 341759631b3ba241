"""`auth.api_keys_file`: a gateway run as users run it (`tailguard serve --config`) reads its
keys from a second file; the real `openai` client with a key from that file is served, any other
key gets 401, a key added to the file serves after `tailguard config reload`, and no key reaches
the gateway's log."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import openai

from tailguard.config import load_config
from tailguard.gateway.ops.store import ConfigStore
from tailguard.sim.server import running_sim
from tests.functional.gateway_processes import gateway_process
from tests.functional.gateways import SCALE, engine

CHAT = [{"role": "user", "content": "hi"}]
FIRST, ADDED, INLINE = "sk-file-first-0123456789", "sk-file-added-0123456789", "sk-inline-0123456789"


async def _answers(url: str, key: str) -> bool:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20) as c:
        try:
            r = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
        except openai.AuthenticationError:
            return False
    return r.choices[0].message.content == " tok tok"


async def test_keys_come_from_the_key_file_and_a_reload_reads_it_again(tmp_path: Path) -> None:
    keys = tmp_path / "secret-keys.yaml"
    keys.write_text(f"{FIRST}: {{name: team-a}}\n")
    async with asyncio.timeout(90), running_sim(engine(), time_scale=SCALE) as sim:
        cfg = {"backends": [{"name": "sim", "url": sim.url, "kind": "sim", "max_concurrency": 4}],
               "auth": {"api_keys": {INLINE: {"name": "inline"}}, "api_keys_file": keys.name,
                        "admin_keys": ["sk-admin-0123456789abcdef"]}}
        async with gateway_process(tmp_path, cfg) as gw:
            assert await _answers(gw.url, FIRST) and await _answers(gw.url, INLINE)
            assert not await _answers(gw.url, ADDED)
            keys.write_text(f"{FIRST}: {{name: team-a}}\n{ADDED}: {{name: team-b}}\n")
            reload = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tailguard", "config", "reload", "-c", str(tmp_path / "tailguard.yaml"),
                "--state-dir", str(tmp_path / "state"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            said = (await reload.communicate())[0].decode()
            assert reload.returncode == 0, said
            assert await _answers(gw.url, ADDED)
            log = "".join(gw.lines)
    assert all(k not in log and k not in said for k in (FIRST, ADDED, INLINE))


def test_a_rollback_never_writes_the_keys_into_a_config_that_reads_a_key_file(tmp_path: Path) -> None:
    """Refused before the gateway is asked anything (none runs here): the stored config holds the
    keys themselves, and `--write` would have copied them into the config file."""
    path = tmp_path / "tailguard.yaml"
    path.write_text("backends: [{name: b, url: 'http://127.0.0.1:1'}]\nauth: {api_keys_file: k.yaml}\n")
    (tmp_path / "k.yaml").write_text(f"{FIRST}: {{}}\n")
    store = tmp_path / "state"
    ConfigStore(store).record(load_config(path), "start")
    done = subprocess.run([sys.executable, "-m", "tailguard", "config", "rollback", "--to", "1", "--write",
                           "-c", str(path), "--state-dir", str(store)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "api_keys_file" in done.stderr, done.stderr
    assert FIRST not in path.read_text() and FIRST not in done.stderr + done.stdout
