"""tailguard.client: the openai SDK with staged deadlines, retries that back off and read
Retry-After, and a retry budget. Imports only the standard library, openai and the HTTP library
it is built on (httpx2; httpx before openai 3).

    from tailguard.client import openai_client, Timeouts, RetryPolicy
    client = openai_client(base_url="http://127.0.0.1:8080/v1", api_key="...",
                           timeouts=Timeouts(connect=5, first_token=30, idle=15, total=None))

The pieces, for an `openai.OpenAI(http_client=...)` built by hand: `RetryTransport`,
`AsyncRetryTransport` and the `ClientState` they share (`client_state(...)` builds one).
"""

from tailguard.client.async_transport import AsyncRetryTransport
from tailguard.client.exceptions import (
    ConnectionFailed, ConnectTimeout, DeadlineExceeded, FirstTokenTimeout, IdleTimeout, RateLimited, Rejected,
    StreamBroken, TotalTimeout, Unavailable,
)
from tailguard.client.flow import ClientState
from tailguard.client.retry import RetryPolicy, parse_retry_after
from tailguard.client.sdk import async_openai_client, client_state, openai_client
from tailguard.client.sync_transport import RetryTransport
from tailguard.client.timeouts import Timeouts
from tailguard.retry_budget import RetryBudget

__all__ = [
    "AsyncRetryTransport", "ClientState", "ConnectionFailed", "ConnectTimeout", "DeadlineExceeded", "FirstTokenTimeout",
    "IdleTimeout", "RateLimited", "Rejected", "RetryBudget", "RetryPolicy", "RetryTransport", "StreamBroken", "Timeouts",
    "TotalTimeout", "Unavailable", "async_openai_client", "client_state", "openai_client", "parse_retry_after",
]
