"""What the bench learns about its target before it sends any load: that it answers at all, that
it speaks the OpenAI API, which model to ask for, and whether it runs on simulated time.

One `GET /v1/models` decides. Every way it can fail becomes a `TargetError` whose one line says
what went wrong and where, so a wrong URL or a missing key ends the run before a single request
is sent, instead of a run of connection errors called "invalid".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from tailguard.errors import TargetError

_BODY_LIMIT = 200


@dataclass(frozen=True, slots=True)
class Target:
    """The model the bench will ask for, and the time scale the target says it runs at
    (`tailguard sim --time-scale X` lists X on its model; None for a real engine)."""

    model: str
    time_scale: float | None


def base_url(url: str) -> str:
    """`http://host:port`, `.../v1` and a trailing slash all name the same server."""
    u = url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


async def probe(session: aiohttp.ClientSession, url: str, *, api_key: str | None, timeout_s: float,
                model: str | None) -> Target:
    """Ask `url` for its models; raises `TargetError` when the bench could not measure it."""
    where = f"{url}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(where, headers=headers) as resp:
                status, reason, body = resp.status, resp.reason or "", await resp.read()
    except aiohttp.ClientConnectorDNSError:
        raise TargetError(f"cannot resolve host {urlsplit(url).hostname!r} (from --url {url})") from None
    except aiohttp.ClientConnectorError as e:
        raise TargetError(f"cannot connect to {e.host}:{e.port} (from --url {url}): {_os_reason(e)}") from None
    except (TimeoutError, aiohttp.ServerTimeoutError):
        raise TargetError(f"no answer from {where} within {timeout_s:g} s") from None
    except aiohttp.ClientError as e:
        raise TargetError(f"{where} did not answer over HTTP: {type(e).__name__}: {e}") from None
    if status != 200:
        raise TargetError(_status_line(where, status, reason, body, api_key))
    return read_model_list(where, body, model)


async def gateway_config(session: aiohttp.ClientSession, url: str, *, api_key: str | None,
                         timeout_s: float) -> dict[str, Any] | None:
    """A tailguard gateway's running config (`GET /config`: its hash, number and settings, secrets
    as fingerprints), recorded so two runs' settings can be compared; None from anything else."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with asyncio.timeout(timeout_s), session.get(f"{url}/config", headers=headers) as resp:
            if resp.status != 200:
                return None
            data = orjson.loads(await resp.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("hash"), str) else None


async def engine_name(session: aiohttp.ClientSession, url: str, *, timeout_s: float) -> str | None:
    """The engine a server names itself as at `GET /version` (`tailguard sim`: `tailguard-sim`),
    recorded so doctor knows a run that went straight to the simulator; None from anything else."""
    try:
        async with asyncio.timeout(timeout_s), session.get(f"{url}/version") as resp:
            data = orjson.loads(await resp.read()) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return None
    engine = data.get("engine") if isinstance(data, dict) else None
    return engine if isinstance(engine, str) else None


def _os_reason(e: aiohttp.ClientConnectorError) -> str:
    if isinstance(e.os_error, ConnectionRefusedError):
        return "connection refused (nothing listens there: is the server running, on that port?)"
    return e.os_error.strerror or str(e.os_error)


def _status_line(where: str, status: int, reason: str, body: bytes, api_key: str | None) -> str:
    head = f"GET {where} answered {status} {reason}".rstrip()
    if status in (401, 403):
        fix = "the key was refused" if api_key else "pass --api-key KEY (or set TAILGUARD_API_KEY)"
        return f"{head}: {fix}"
    if status == 404:
        return f"{head}: is {where[:-len('/v1/models')]} the base URL of an OpenAI-compatible server?"
    text = body[:_BODY_LIMIT].decode("utf-8", "replace").replace("\n", " ").strip()
    return f"{head}: {text}" if text else head


def read_model_list(where: str, body: bytes, model: str | None) -> Target:
    """The model to ask for (`model`, or the first listed) and the time scale the list states."""
    try:
        data: Any = orjson.loads(body)
        items = [m for m in data["data"] if isinstance(m, dict)]
    except (orjson.JSONDecodeError, TypeError, KeyError):
        raise TargetError(f"{where} is not an OpenAI model list (is this an OpenAI-compatible server?)") from None
    chosen = next((m for m in items if m.get("id") == model), None) if model else (items[0] if items else None)
    if chosen is None and model is None:
        raise TargetError(f"{where} lists no model; pass --model NAME")
    # A --model the server does not list is still sent: gateways may route names they do not list.
    listed = chosen or (items[0] if items else {})
    scale = listed.get("time_scale")
    return Target(model=model or str(listed["id"]),
                  time_scale=float(scale) if isinstance(scale, (int, float)) and scale > 0 else None)


def time_scale_for(given: float | None, reported: float | None, url: str) -> float:
    """The time scale to report in: the one given, else the one the target announces (`tailguard
    sim` lists it on its model, and a gateway in front lists its simulator's), so a run against a
    simulator reads in simulated seconds unless `--time-scale 1` asks for wall seconds. A given
    scale that contradicts the announced one is an error: one of the two is wrong."""
    if reported is None or reported == 1.0:
        return 1.0 if given is None else given
    if given is None:
        return reported
    if given not in (1.0, reported):
        raise TargetError(f"--time-scale {given:g}, but {url} says its time scale is {reported:g}")
    return given
