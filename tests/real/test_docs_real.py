"""The llama.cpp and vLLM configs printed in docs/engines.md, run as written against the real servers
(only the URL is pointed at the test's engine and the port at a free one)."""

from __future__ import annotations

import asyncio

import pytest
import yaml
from openai import AsyncOpenAI

from tailguard.config import GatewayConfig
from tests.real.processes import EngineProcess
from tests.real.test_gateway_real import gateway
from tests.unit.gateway.test_kinds import engine_doc_configs

pytestmark = pytest.mark.real


async def test_the_documented_config_serves(engine: EngineProcess) -> None:
    doc = yaml.safe_load(engine_doc_configs()[engine.kind])
    doc["port"] = 0
    doc["backends"][0]["url"] = engine.base_url
    cfg = GatewayConfig.model_validate(doc)
    async with gateway(cfg) as url, AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c, \
            asyncio.timeout(60):
        r = await c.chat.completions.create(model=engine.model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=7)
    assert r.usage is not None and r.usage.completion_tokens == 7
