"""The public names of tailguard.client (httpx's test_exported_members), and the exception tree the
module docstring draws: each class sits under the openai exception existing code already catches."""

from __future__ import annotations

import openai

import tailguard.client as client
from tailguard.client import exceptions


def test_all_lists_exactly_the_public_names() -> None:
    public = {n for n in vars(client) if not n.startswith("_")} - {
        "annotations", "async_transport", "exceptions", "flow", "retry", "sdk", "sync_transport", "timeouts",
        "assembly", "chunks", "watchdog", "httplib"}
    assert set(client.__all__) == public


def test_the_exception_tree() -> None:
    for cls in (client.ConnectTimeout, client.FirstTokenTimeout, client.IdleTimeout, client.TotalTimeout):
        assert cls.__bases__ == (client.DeadlineExceeded,)
    assert issubclass(client.DeadlineExceeded, openai.APITimeoutError)
    assert issubclass(client.RateLimited, client.Rejected) and issubclass(client.RateLimited, openai.RateLimitError)
    assert issubclass(client.Unavailable, client.Rejected) and issubclass(client.Unavailable, openai.InternalServerError)
    assert issubclass(client.Rejected, openai.APIStatusError)
    for name in ("DeadlineExceeded", "ConnectTimeout", "FirstTokenTimeout", "IdleTimeout", "TotalTimeout",
                 "RateLimited", "Unavailable", "Rejected"):
        assert name in (exceptions.__doc__ or ""), f"{name} missing from the drawn tree"
