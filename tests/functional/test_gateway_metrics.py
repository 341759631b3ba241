"""/metrics as a Prometheus user expects it, on a real gateway: the standard collectors, what runs
(build and config), no `_created` series, no placeholder labels, every family from the catalog,
one reason word in the metric, the header and the access log, and retries counted by why."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from tailguard.config import BackendConfig
from tailguard.gateway.ops.catalog import METRICS, exposed_names
from tailguard.gateway.ops.access import ACCESS_LOGGER
from tests.functional.gateways import dead_url, gateway, sample, scrape

CHAT = [{"role": "user", "content": "hello there"}]


async def test_metrics_follow_prometheus_habits(caplog: pytest.LogCaptureFixture) -> None:
    keys = {"sk-app": {"name": "app", "rpm_limit": 2}}
    # Said to serve the model, so it is tried beside the simulator once the simulator's models are known.
    dead = BackendConfig(name="dead", url=dead_url(), max_concurrency=4, models=["tailguard-sim"])
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with asyncio.timeout(30), gateway(auth={"api_keys": keys}, extra_backends=[dead],
                                           routing={"policy": "round-robin"}) as gw, \
            AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-app", max_retries=0) as app:
        for _ in range(2):  # round robin: one of them meets the dead backend first and is retried
            assert (await app.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)).choices
        with pytest.raises(openai.RateLimitError) as over:
            await app.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
        async with aiohttp.ClientSession() as s, s.post(f"{gw.url}/v1/chat/completions", json={}) as r:
            assert r.status == 401  # no key: refused before it has a class
        text = await _page(gw.url)
        samples = await scrape(gw.url)

    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"} <= names
    assert not [n for n in names if n.endswith("_created")]
    assert names <= exposed_names(), f"not in the catalog: {names - exposed_names()}"
    assert 'class="none"' not in text and '=""' not in text.replace('number=""', "")
    assert sample(samples, "tailguard_unclassified_requests_total", status="401") == 1
    build = [k for k in samples if k[0] == "tailguard_build_info"]
    assert len(build) == 1 and dict(build[0][1])["version"]
    config = [dict(k[1]) for k in samples if k[0] == "tailguard_config_info"]
    assert len(config) == 1 and len(config[0]["hash"]) >= 8
    assert sample(samples, "tailguard_backend_concurrency_limit", backend="sim0") == 8
    assert sample(samples, "tailguard_backend_concurrency_limit", backend="dead") == 4
    assert sample(samples, "tailguard_class_queue_bound_seconds", **{"class": "interactive"}) > 0
    assert sample(samples, "tailguard_retries_total", backend="dead", kind="connect") >= 1
    assert sample(samples, "tailguard_capacity_ready", pool="default") >= 1
    assert sample(samples, "gen_ai_server_time_to_first_token_seconds_count",
                  gen_ai_operation_name="chat", **{"class": "interactive"}) == 2
    _check_genai_usage(samples)
    # One word for one refusal: the header, the metric and the access log.
    reason = over.value.response.headers["x-tailguard-reject-reason"]
    assert sample(samples, "tailguard_rejected_total", **{"class": "interactive", "reason": reason}) == 1
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]
    assert [ln["reason"] for ln in lines if ln["status"] == 429] == [reason]
    assert len(METRICS) == len({m.name for m in METRICS})


async def _page(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        return await r.text()


def _check_genai_usage(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> None:
    """The OpenTelemetry GenAI token families (gen-ai-inference-usage-metrics.md) count the two
    answered chats: each made 2 tokens of output, on the simulator (kind `sim`, the provider)."""
    chat = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "sim"}
    assert sample(samples, "gen_ai_client_inference_usage_output_tokens_count", **chat) == 2
    assert sample(samples, "gen_ai_client_inference_usage_output_tokens_sum", **chat) == 4
    assert sample(samples, "gen_ai_client_inference_usage_output_tokens_bucket", le="4.0", **chat) == 2
    assert sample(samples, "gen_ai_client_inference_usage_output_tokens_bucket", le="1.0", **chat) == 0
    prompts = sample(samples, "gen_ai_client_inference_usage_input_tokens_sum", **chat)
    assert prompts > 0 and sample(samples, "gen_ai_client_inference_usage_input_tokens_count", **chat) == 2
    assert sample(samples, "gen_ai_client_inference_usage_detailed_output_tokens_total", gen_ai_token_modality="text",
                  **chat) == 4
    assert sample(samples, "gen_ai_client_inference_usage_detailed_input_tokens_total",
                  gen_ai_token_modality="unknown", **chat) == prompts
    assert sample(samples, "gen_ai_client_token_usage_sum", gen_ai_token_type="output", **chat) == 4
