"""A small HTTP answer read with aiohttp, bounded in bytes as they arrive: what the gateway's
probes, its model list and a guard's moderation service may answer, so a server that answers
endlessly costs at most the bound."""

from __future__ import annotations

import aiohttp


class BodyTooLarge(aiohttp.ClientPayloadError):
    """An answer passed its bound (an aiohttp client error, so whoever reads one treats it as
    any failed read)."""


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The answer's body, refused past `limit` bytes."""
    if resp.content_length is not None and resp.content_length > limit:
        raise BodyTooLarge(f"answer of {resp.content_length} bytes is over the limit of {limit}")
    out = bytearray()
    async for piece in resp.content.iter_any():
        out += piece
        if len(out) > limit:
            raise BodyTooLarge(f"answer over the limit of {limit} bytes")
    return bytes(out)
