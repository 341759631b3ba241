"""Traces end to end: the gateway exports OTLP over HTTP to a receiver process the test starts;
a request's trace holds its queue wait, each attempt (the failed one marked, the retry saying
why), a suspension and its continuation; a caller's `traceparent` is honoured and sent upstream."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tailguard.config import BackendConfig
from tests.functional.gateways import classes, gateway
from tests.functional.raw_servers import raw_server, read_request

CHAT = [{"role": "user", "content": "y" * 40}]
TRACE_IDS = ("4bf92f3577b34da6a3ce929d0e0e4736", "5cf92f3577b34da6a3ce929d0e0e4737")
PARENT = "00f067aa0ba902b7"
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def receiver(out: Path) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.functional.otlp_receiver", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1/traces"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


async def test_a_trace_shows_queue_attempts_a_retry_and_a_suspension(tmp_path: Path) -> None:
    heads: list[bytes] = []

    async def drops(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await read_request(r)
        if head.startswith(b"POST"):
            heads.append(head)  # then the connection closes unanswered: a retry on another

    out = tmp_path / "spans.jsonl"
    with receiver(out) as endpoint:
        telemetry = {"otlp_endpoint": endpoint}
        async with asyncio.timeout(40), raw_server(drops) as flaky_url:
            flaky = BackendConfig(name="flaky", url=flaky_url, max_concurrency=1, models=["tailguard-sim"])
            # Three attempts: the flaky one, the same on a fresh connection, then the simulator.
            async with gateway(extra_backends=[flaky], telemetry=telemetry, retries={"max_attempts": 3},
                               routing={"policy": "round-robin"}) as gw, gw.client() as c:
                for trace_id in TRACE_IDS:  # round robin: one of the two meets the flaky backend first
                    await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4, extra_headers={
                        "traceparent": f"00-{trace_id}-{PARENT}-01"})
        preemptible = {"classes": classes(batch={"preemptible": True, "max_share": 1.0}),
                       "scheduler": {"min_run_s": 0.0}}
        async with asyncio.timeout(40), gateway(max_concurrency=1, scale=0.05, telemetry=telemetry,
                                                **preemptible) as gw, gw.client() as c:
            batch = await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=400, stream=True,
                                                    extra_headers={"X-Tailguard-Class": "batch"})
            n = 0
            async for _ in batch:
                n += 1
                if n == 20:  # the batch stream runs on the only slot: a chat takes it
                    await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=4)
            async for _ in await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=6, stream=True):
                pass  # a plain stream: relayed chunk by chunk, untouched
        # Each gateway has stopped: its exporter flushed every span before it did.
        spans = [json.loads(line) for line in out.read_text().splitlines()]

    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
    retried = [t for t in TRACE_IDS if any(s["name"] == "upstream flaky" for s in by_trace[t])]
    assert retried
    trace_id = retried[0]
    assert any(f"traceparent: 00-{trace_id}-".encode() in h.lower() for h in heads), "sent upstream"
    first = {s["name"]: s for s in by_trace[trace_id]}
    root = first["chat tailguard-sim"]
    assert root["parent_span_id"] == PARENT and root["kind"] == 2  # SERVER, the caller's child
    assert root["service"] == "tailguard"
    a = root["attributes"]
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "tailguard-sim"
    assert a["gen_ai.provider.name"] == "sim" and a["gen_ai.usage.output_tokens"] == 4
    assert a["gen_ai.usage.input_tokens"] > 0 and a["tailguard.class"] == "interactive"
    assert a["tailguard.outcome"] == "success" and a["tailguard.attempts"] >= 2
    # How the answer ended, read from the simulator's chunks (non-stream: assembled at the gateway).
    assert a["gen_ai.response.finish_reasons"] == ["length"] and a["gen_ai.response.id"].startswith("chatcmpl")
    assert a["gen_ai.response.model"] == "tailguard-sim" and a["gen_ai.request.max_tokens"] == 4
    assert a["gen_ai.request.stream"] is False
    children = [s for s in by_trace[trace_id] if s["parent_span_id"] == root["span_id"]]
    names = [s["name"] for s in sorted(children, key=lambda s: s["start"])]
    assert names[0] == "queue" and names[-1] == "upstream sim0" and "upstream flaky" in names
    failed = [s for s in children if s["name"] == "upstream flaky"]
    assert all(s["attributes"]["error.type"] in ("reset", "disconnect") and s["status"] == 2 for s in failed)
    retry = next(s for s in children if s["name"] == "upstream sim0")
    assert retry["attributes"]["tailguard.retry_reason"] in ("reset", "disconnect") and retry["kind"] == 3
    assert all(root["start"] <= s["start"] <= s["end"] <= root["end"] for s in children)

    batch_root = next(s for s in spans if s["attributes"].get("tailguard.class") == "batch")
    kids = sorted((s for s in by_trace[batch_root["trace_id"]] if s["parent_span_id"] == batch_root["span_id"]),
                  key=lambda s: s["start"])
    assert batch_root["attributes"]["tailguard.preemptions"] == 1
    # A stream suspended and continued: one id, the first run's, and the one finish reason of the end.
    assert batch_root["attributes"]["gen_ai.response.finish_reasons"] == ["length"]
    assert batch_root["attributes"]["gen_ai.response.id"].startswith("chatcmpl")
    assert batch_root["attributes"]["gen_ai.request.stream"] is True
    chat_roots = [s for s in by_trace.values() for s in s if s["name"] == "chat tailguard-sim" and s["parent_span_id"] == ""]
    assert all(s["attributes"]["gen_ai.response.finish_reasons"] == ["length"] for s in chat_roots
               if s["attributes"]["tailguard.outcome"] == "success")
    plain = [s["attributes"] for s in chat_roots if s["attributes"].get("gen_ai.request.max_tokens") == 6]
    assert len(plain) == 1 and plain[0]["gen_ai.request.stream"] is True
    assert plain[0]["gen_ai.response.finish_reasons"] == ["length"] and plain[0]["gen_ai.usage.output_tokens"] == 6
    assert [s["name"] for s in kids][-3:] == ["upstream sim0", "suspended", "upstream sim0"]
    assert kids[-3]["attributes"]["tailguard.suspended"] is True and kids[-1]["attributes"]["tailguard.resumed"]
