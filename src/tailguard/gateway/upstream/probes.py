"""What the gateway asks each backend in the background, for ever: what it is (`kind: auto`, at
start and whenever it comes back), whether it is healthy (every `health.interval_s`), which models
it serves (its `/v1/models`, unless the config names them), and how many requests the engine
itself reports running and waiting (its load page, where the kind has one). Every request is bounded by `health.timeout_s`, so a backend that never answers holds up
nothing but its own probes; what is learnt goes to the front (health, kind, models, load) and to `/health`,
`/v1/models` and `/metrics`. A probe that times out while the backend is streaming to requests in flight is
reported as `busy`, which the front does not count against it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
import orjson

from tailguard.clock import Now
from tailguard.front.events import KindLearned, Loaded, Probed, Served
from tailguard.config import BackendConfig
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.ops.live import Live
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.upstream.client import read_capped
from tailguard.gateway.upstream.kinds import DETECT_PATHS, EngineLoad, detect_kind, get_kind

log = logging.getLogger("tailguard.gateway")


@dataclass(frozen=True, slots=True)
class _Failed:
    """Why a probe got no 2xx answer; `timed_out`: none at all within `health.timeout_s`;
    `answered`: the server did answer, with another status."""

    reason: str
    timed_out: bool = False
    answered: bool = False


class Probes:
    """The probe loops of every backend; `backends` (kinds resolved) is updated in place when a
    kind is detected, which is what the exchanges read. Each probe reads the `health` section of
    the live config as it is sent, and a reload that changes it wakes every loop (`retime`), so
    the new path, timeout and interval apply at once, not after the interval being slept out."""

    def __init__(self, live: Live, backends: dict[str, BackendConfig], dispatcher: Dispatcher,
                 session: aiohttp.ClientSession, metrics: GatewayMetrics, clock: Now) -> None:
        self.live, self.backends, self.dispatcher, self.session, self.metrics = live, backends, dispatcher, session, metrics
        self._clock = clock
        self.load: dict[str, EngineLoad] = {}  # the engine's own count, from its last load page
        self.models: dict[str, list[dict[str, Any]]] = {}  # each backend's /v1/models entries, as it gave them
        self.load_at: dict[str, float] = {}  # when that page was read (its figures' age in /health)
        # Why the last health probe of each backend failed (None once one succeeds): logged when it
        # turns a backend unhealthy and shown in `/health`, so "unhealthy" always says why.
        self.last_error: dict[str, str | None] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # loops of removed backends, until they end
        self._wake = asyncio.Event()  # set (and replaced) by `retime`: every loop probes again now
        self._undetected: dict[str, str] = {}  # backends whose kind could not be detected, at which URL
        self._asked: set[str] = set()  # backends whose models `known_models` has read out of turn

    def start(self) -> None:
        """One probe loop per configured backend."""
        for b in self.live.cfg.backends:
            self._start(b)

    def follow(self, added: Iterable[BackendConfig], removed: Iterable[str]) -> None:
        """A reload added and removed backends: probe the new ones, and stop probing the removed
        ones at once (they take no new request, so their health no longer decides anything)."""
        for name in removed:
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
            self.load.pop(name, None)
            self.models.pop(name, None)
            self._asked.discard(name)
            self.load_at.pop(name, None)
            self.last_error.pop(name, None)
            self._undetected.pop(name, None)
        for b in added:
            self._start(b)

    def retime(self) -> None:
        """The health settings changed: every loop stops waiting and probes by them now (one
        that is probing at this moment probes again at once, rather than sleeping first)."""
        self._wake.set()
        self._wake = asyncio.Event()

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *self._stopping]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, b: BackendConfig) -> None:
        self._tasks[b.name] = asyncio.create_task(self._loop(b), name=f"tailguard-probe-{b.name}")

    async def _loop(self, configured: BackendConfig) -> None:
        name = configured.name
        auto = configured.kind == "auto"
        detect, healthy, asked, first, unanswered = auto, True, configured.url, True, False
        while True:
            if auto and self.backends[name].url != asked:  # a reload moved it: another server, maybe
                detect, asked = True, self.backends[name].url
            if detect:
                unanswered = not await self._detect(name)
            # The event of the settings read here: set already when a reload came while probing.
            backend, health, wake = self.backends[name], self.live.cfg.health, self._wake
            # An explicit `health.path` wins; else each kind's own (a plain OpenAI server has no /health).
            path = health.path if "path" in health.model_fields_set else get_kind(backend.kind).health_path
            sent_at = self._clock()
            answer = await self._fetch(backend, path)
            failed = answer if isinstance(answer, _Failed) else None
            self.last_error[name] = failed.reason if failed is not None else None
            # No answer in time, but the engine streamed to requests in flight meanwhile: busy.
            busy = failed is not None and failed.timed_out and self.dispatcher.delivered_since(name, sent_at)
            self.dispatcher.tell(Probed(name, failed is None, busy))
            if failed is None:
                await self._read_models(backend)
                await self._read_load(backend)
            if first and not busy:
                first = False
                self._found(self.backends[name], auto, path, failed)
            now_healthy = self.dispatcher.healthy.get(name, False)
            if healthy and not now_healthy and failed is not None:
                log.warning("backend %s: health probe GET %s failed: %s", name, path, failed.reason)
            # It came back, or it answers now where nothing answered when it was asked: ask again.
            detect = auto and now_healthy and (not healthy or (unanswered and failed is None))
            healthy = now_healthy
            if not detect:
                await _pause(health.interval_s, wake)

    def _found(self, backend: BackendConfig, auto: bool, path: str, failed: _Failed | None) -> None:
        """One line per backend when its first probe has answered: reachable (its kind, the
        engine's own count) or why not, so a dead or mistyped backend is said at once rather
        than when enough probes have failed to take it out."""
        name, url = backend.name, backend.url
        if failed is None:
            load = self.load.get(name)
            engine = f"; the engine reports {load.running} running, {load.waiting} waiting" if load is not None else ""
            served = served_models(backend, self.models.get(name))
            models = f"; serves {', '.join(served)}" if served else "; its models are not known: any model may go there"
            log.info("backend %s (%s): reachable, kind %s%s%s%s", name, url, backend.kind,
                     " (detected)" if auto else "", models, engine)
        else:
            log.warning("backend %s (%s): not reachable: GET %s: %s; it is taken out after %d failed probes in "
                        "a row, %g s apart", name, url, path, failed.reason, self.live.cfg.health.unhealthy_after,
                        self.live.cfg.health.interval_s)

    async def _get(self, backend: BackendConfig, path: str) -> bytes | None:
        """The body of a 2xx answer to GET `path`, or None (any other status, error or timeout)."""
        body = await self._fetch(backend, path)
        return body if isinstance(body, bytes) else None

    async def _fetch(self, backend: BackendConfig, path: str) -> bytes | _Failed:
        """The body of a 2xx answer to GET `path`, or why there is none."""
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        timeout_s = self.live.cfg.health.timeout_s
        try:
            async with self.session.get(backend.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                        headers=headers) as resp:
                body = await read_capped(resp, self.live.cfg.limits.max_probe_bytes)
                return body if 200 <= resp.status < 300 else _Failed(f"status {resp.status}", answered=True)
        except asyncio.TimeoutError:
            return _Failed(f"no answer within {timeout_s:g} s", timed_out=True)
        except aiohttp.ClientError as e:
            return _Failed(f"{type(e).__name__}: {e}")

    async def _detect(self, name: str) -> bool:
        """Ask a `kind: auto` backend what it is and switch everything that depends on it (request
        translation, health path, whether its requests can be suspended, its reservation). False
        when nothing answered at all (unreachable): it is asked again once a probe gets through."""
        answers = await asyncio.gather(*(self._fetch(self.backends[name], p) for p in DETECT_PATHS))
        kind = detect_kind({p: a if isinstance(a, bytes) else None for p, a in zip(DETECT_PATHS, answers)})
        reachable = any(isinstance(a, bytes) or a.answered for a in answers)
        current = self.backends[name]  # as it is now: a reload may have changed it meanwhile
        if current.kind != kind:
            log.info("backend %s is %s (detected)", name, kind)
            self.backends[name] = current.model_copy(update={"kind": kind})
            self.metrics.set_kind(name, kind)
        self.dispatcher.tell(KindLearned(name, get_kind(kind).continues_generation))
        if kind == "openai" and reachable and self._undetected.get(name) != current.url:
            self._undetected[name] = current.url  # said once per address (an unreachable one: once it answers)
            view = self.dispatcher.front.backend(name)
            log.warning("backend %s (%s): no engine kind detected (none of %s answered as vLLM, llama.cpp, SGLang, "
                        "TGI or the simulator would): treated as a plain OpenAI server, so its requests cannot be "
                        "suspended for a chat and %d of its %d slots are kept for the top class; if it is an "
                        "engine, name it in the config (kind: vllm, llamacpp, sglang, tgi or sim)",
                        name, current.url, ", ".join(DETECT_PATHS), view.reserved_slots, view.max_concurrency)
        return reachable

    async def known_models(self) -> dict[str, list[dict[str, Any]]]:
        """Each backend's models, reading at once those no probe has read yet (a `/v1/models`
        asked before the first probes are in, as a client's first call often is)."""
        unread = [b for b in self.backends.values() if b.name not in self.models and b.name not in self._asked
                  and not b.models and b.model is None]
        self._asked.update(b.name for b in unread)  # once: a dead backend is left to its probes after that
        if unread:
            await asyncio.gather(*(self._read_models(b) for b in unread))
        return self.models

    async def _read_models(self, backend: BackendConfig) -> None:
        """What the backend's /v1/models lists; the front is told when it changes. A backend whose
        config names its models (or rewrites every request to one) is not asked."""
        if backend.models or backend.model is not None:
            return
        page = await self._get(backend, "/v1/models")
        entries = _model_entries(page) if page is not None else None
        if entries is None:
            return  # unreadable this time: what was known stands
        ids = tuple(m["id"] for m in entries)
        if ids != tuple(m["id"] for m in self.models.get(backend.name, ())) or backend.name not in self.models:
            self.models[backend.name] = entries
            self.dispatcher.tell(Served(backend.name, ids or None))

    async def _read_load(self, backend: BackendConfig) -> None:
        """The engine's own running and waiting counts: a waiting count above zero means requests
        queue inside the engine, first come first served (the gateway's cap is above its slots)."""
        for source in get_kind(backend.kind).load_sources:
            page = await self._get(backend, source.path)
            load = source.parse(page) if page is not None else None
            if load is not None:
                self.load[backend.name] = load
                self.dispatcher.tell(Loaded(backend.name, load.running + load.waiting))
                self.load_at[backend.name] = self._clock()
                self.metrics.engine_requests.labels(backend.name, "running").set(load.running)
                self.metrics.engine_requests.labels(backend.name, "waiting").set(load.waiting)
                return


async def _pause(seconds: float, wake: asyncio.Event) -> None:
    """Sleep `seconds`, or until `wake` is set (at once if it is already)."""
    try:
        await asyncio.wait_for(wake.wait(), seconds)
    except TimeoutError:
        pass


def served_models(backend: BackendConfig, listed: list[dict[str, Any]] | None) -> list[str]:
    """The model ids a backend serves: as configured, its rewrite target, or as it listed them."""
    if backend.models:
        return list(backend.models)
    if backend.model is not None:
        return [backend.model]
    return [m["id"] for m in listed or ()]


def _model_entries(page: bytes) -> list[dict[str, Any]] | None:
    """The model objects of an OpenAI `/v1/models` answer (each with a string id), or None when it
    is not one."""
    try:
        data = orjson.loads(page)
    except orjson.JSONDecodeError:
        return None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    return [m for m in items if isinstance(m, dict) and isinstance(m.get("id"), str)]
