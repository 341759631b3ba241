"""Every refusal is the front's, shared ones too: a recording gateway whose caller's limits live in a
real `redis-server` refuses what another replica's use spent over all replicas (the verdict rides
on the request's `Arrive`), then, Redis killed, keeps 1/N of each limit itself (`LocalShare`,
`on_unavailable: local`); the recording holds each of these refusals and a fresh front replays
them decision for decision."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai

from tailguard.clock import monotonic
from tailguard.config import StateConfig
from tailguard.front.events import Arrive, LocalShare, Reject
from tailguard.front.params import CallerSpec
from tailguard.gateway.shared.limits import SharedLimits
from tailguard.gateway.shared.link import Link
from tailguard.recording.codec import read
from tailguard.recording.replay import conform
from tailguard.types import RejectReason
from tests.functional.gateways import gateway
from tests.functional.redis_server import redis_server

CHAT = [{"role": "user", "content": "hi"}]
RPM = 6
KEYS = {"sk-team": {"name": "team", "rpm_limit": RPM}}


async def test_shared_refusals_are_recorded_and_replay_identically(tmp_path: Path) -> None:
    path = tmp_path / "front.jsonl"
    async with asyncio.timeout(60), redis_server(tmp_path) as server:
        state = {"url": server.url, "on_unavailable": "local", "replicas": 2, "lease_s": 0.3, "timeout_s": 0.5}
        # The other replica: it spends the caller's shared bucket, as its own traffic would.
        other = SharedLimits(Link(StateConfig.model_validate(state), lambda up: None),
                             [CallerSpec("team", requests_per_minute=RPM)], monotonic)
        try:
            for _ in range(RPM - 1):
                assert (await other.reserve("team", 10))[1] is not None
        finally:
            await other.close()
            await other.link.close()
        async with gateway(record=path, auth={"api_keys": KEYS}, state=state) as gw, \
                openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-team", max_retries=0) as c:
            await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)  # the last of the six
            try:
                await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
            except openai.RateLimitError as e:
                assert "over all replicas" in e.message
            else:
                raise AssertionError("the seventh request of the minute was let in")
            await server.kill()  # Redis gone: half of 6 a minute here, from this replica's own use
            outcomes = []
            for _ in range(4):
                try:
                    await c.chat.completions.create(model="tailguard-sim", messages=CHAT, max_tokens=2)
                    outcomes.append("ok")
                except openai.RateLimitError as e:
                    assert "over all replicas" not in e.message
                    outcomes.append("429")
            assert "429" in outcomes
    rec = read(path.read_text().splitlines())
    events = [s.event for s in rec.steps]
    rejects = [d for s in rec.steps for d in s.decisions if isinstance(d, Reject)]
    assert any(isinstance(e, Arrive) and e.shared is not None and e.shared.reason is not None for e in events)
    assert [e.replicas for e in events if isinstance(e, LocalShare)] == [2]
    assert any(r.shared and r.reason is RejectReason.RATE_LIMIT_REQUESTS for r in rejects)
    assert any(not r.shared and r.reason is RejectReason.RATE_LIMIT_REQUESTS for r in rejects)
    result = conform(rec)
    assert result.identical, str(result)
