"""`openai_client` and `async_openai_client`: the real openai SDK, wired to this package's
transports, so existing code keeps its calls and gains staged deadlines, retries and a budget.

The SDK's own retries are switched off (`max_retries=0`): two retry loops would multiply each
other, and the SDK's cannot see the first token or share a budget.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import openai

from tailguard.client.async_transport import AsyncRetryTransport
from tailguard.client.flow import ClientState
from tailguard.client.httplib import httpx
from tailguard.client.retry import RetryPolicy
from tailguard.client.sync_transport import RetryTransport
from tailguard.client.timeouts import Timeouts
from tailguard.retry_budget import RetryBudget


def client_state(base_url: str | Sequence[str], timeouts: Timeouts | None = None,
                 retry: RetryPolicy | None = None, budget: RetryBudget | bool = True,
                 seed: int | None = None) -> ClientState:
    """What a client's calls share. `base_url` may list replicas: a try that fails on one
    (connection, 502/503/504, a deadline before content) goes to the next. `budget=False` turns
    the retry budget off; pass one `RetryBudget` to several clients to share it."""
    urls = (base_url,) if isinstance(base_url, str) else tuple(base_url)
    if not urls:
        raise ValueError("base_url names no server")
    chosen = RetryBudget() if budget is True else budget or None
    return ClientState(timeouts or Timeouts(), retry or RetryPolicy(), chosen, urls, rng=random.Random(seed))


def openai_client(*, base_url: str | Sequence[str], timeouts: Timeouts | None = None,
                  retry: RetryPolicy | None = None, budget: RetryBudget | bool = True,
                  seed: int | None = None, **openai_kwargs: Any) -> openai.OpenAI:
    """An `openai.OpenAI` with staged deadlines and retries; other arguments go to the SDK.

        client = openai_client(base_url="http://127.0.0.1:8080/v1", api_key="...",
                               timeouts=Timeouts(connect=5, first_token=30, idle=15, total=None),
                               retry=RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=8.0))
    """
    state = client_state(base_url, timeouts, retry, budget, seed)
    http = httpx.Client(transport=RetryTransport(state))
    return openai.OpenAI(base_url=state.base_urls[0], max_retries=0, http_client=http, **openai_kwargs)


def async_openai_client(*, base_url: str | Sequence[str], timeouts: Timeouts | None = None,
                        retry: RetryPolicy | None = None, budget: RetryBudget | bool = True,
                        seed: int | None = None, **openai_kwargs: Any) -> openai.AsyncOpenAI:
    """The same as `openai_client`, for `openai.AsyncOpenAI`."""
    state = client_state(base_url, timeouts, retry, budget, seed)
    http = httpx.AsyncClient(transport=AsyncRetryTransport(state))
    return openai.AsyncOpenAI(base_url=state.base_urls[0], max_retries=0, http_client=http, **openai_kwargs)
