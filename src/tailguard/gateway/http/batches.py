"""OpenAI's Files and Batches API on the gateway: `/v1/files` (upload, list, get, content,
delete) and `/v1/batches` (create, list, get, cancel, and our `retry`), over the batch journal
and file store (`tailguard.batch`), with the runner running each line through the gateway's own
request path (`Lifecycle.run`) as the batch class. A file or batch belongs to the key that made it
(its fingerprint); another key gets 404, as if it did not exist.

    app.cleanup_ctx.append(batches_lifecycle)   # after the gateway's own: it needs its lifecycle
    add_routes(app)
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import BodyPartReader, web

from tailguard.batch.files import FileStore
from tailguard.batch.journal import Journal
from tailguard.batch.metrics import BatchCollector
from tailguard.batch.records import ENDPOINTS, FINAL, BatchRecord, FileRecord, Line, new_id
from tailguard.batch.runner import Answer, Runner
from tailguard.batch.sqlite import SqliteJournal
from tailguard.batch.validation import ENDPOINT_OF
from tailguard.errors import APIError, BadRequest, NotFound, RateLimited
from tailguard.front.intake import KeyDigest, key_id
from tailguard.wire.headers import CLASS_HEADER, bearer_key
from tailguard.front.params import KeySpec
from tailguard.config import BatchesConfig
from tailguard.config.base import fingerprint
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.classes import Unauthorized
from tailguard.gateway.lifecycle import Lifecycle
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.sink import ChunkQueue
from tailguard.wire.openai import error_body

_WINDOW = re.compile(r"^(\d+)([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
_MAX_METADATA = 16


class GatewayFront:
    """The runner's `RequestPath`: lines enter as the batch class while fewer than `ahead` wait in its
    queue, each as a request of the key that made its batch (its classes, models, rate limits,
    reservations and metering), known by the key's digest recorded with the batch."""

    def __init__(self, lifecycle: Callable[[], Lifecycle], dispatcher: Dispatcher, cls: str, ahead: int) -> None:
        self._lifecycle, self._dispatcher, self.cls, self.ahead = lifecycle, dispatcher, cls, ahead

    def room(self) -> int:
        front = self._dispatcher.front
        if not front.any_healthy():
            return 0
        return max(0, self.ahead - front.queue_len(self.cls))

    def enqueued_limit(self, owner_key: str | None) -> int | None:
        key = self._key(owner_key)
        return key.batch_enqueued_tokens if key is not None else None

    def _key(self, owner_key: str | None) -> KeySpec | None:
        return None if owner_key is None else self._lifecycle().classes.intake.key(KeyDigest(owner_key))

    async def run(self, line: Line, endpoint: str, owner_key: str | None) -> Answer:
        lifecycle = self._lifecycle()
        if owner_key is not None and lifecycle.classes.auth_required and self._key(owner_key) is None:
            err = Unauthorized("The API key that created this batch is no longer accepted by the gateway.",
                               code="invalid_api_key")
            return Answer(err.status, error_body(err), line.custom_id)
        sink = ChunkQueue()
        ending = await lifecycle.run(line.body, ENDPOINT_OF[endpoint], sink, {CLASS_HEADER: self.cls},
                                 None if owner_key is None else KeyDigest(owner_key))
        rid = sink.headers.get("x-request-id", "") or line.custom_id
        if ending.passthrough is not None:
            return Answer(ending.passthrough.status, ending.passthrough.body, rid)
        if isinstance(ending.error, RateLimited):  # the owner's own limit: paced, not an attempt
            return Answer(ending.error.status, error_body(ending.error), rid, ending.error.retry_after_s or 1.0)
        if ending.error is not None:
            return Answer(ending.error.status, error_body(ending.error), rid)
        if not sink.started:
            return Answer(502, orjson.dumps({"error": {"message": "The backend sent no answer.",
                                                       "type": "server_error"}}), rid)
        body = b"".join([chunk async for chunk in sink])
        return Answer(ending.status, body, rid)


class Batches:
    """The routes' state: the journal, the files, the runner, the settings."""

    def __init__(self, journal: Journal, files: FileStore, runner: Runner, cfg: BatchesConfig,
                 authenticate: Callable[[str | None], None]) -> None:
        self.journal, self.files, self.runner, self.cfg = journal, files, runner, cfg
        self._authenticate = authenticate

    def owner(self, request: web.Request) -> str:
        """Whose request it is: its key's fingerprint (after the gateway's own check), '' without a key."""
        return self.owner_and_key(request)[0]

    def owner_and_key(self, request: web.Request) -> tuple[str, str | None]:
        """Its owner, and its key's SHA-256 digest (what a batch's lines run as), None without a key."""
        key = bearer_key(request.headers)
        self._authenticate(key)
        return ("", None) if key is None else (fingerprint(key), key_id(key))

    async def file_of(self, owner: str, file_id: str) -> FileRecord:
        f = await self.journal.get_file(file_id)
        if f is None or f.owner != owner:
            raise NotFound(f"No such File object: {file_id}", param="id", code="not_found")
        return f

    async def batch_of(self, owner: str, batch_id: str) -> BatchRecord:
        b = await self.journal.get_batch(batch_id)
        if b is None or b.owner != owner:
            raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id", code="not_found")
        return b


SERVICE = web.AppKey("batches", Batches)


def journal_for(cfg: BatchesConfig, root: Path) -> Journal:
    """The journal `batches.store` names: SQLite in `root`, or PostgreSQL at its URL."""
    if cfg.store == "sqlite":
        return SqliteJournal(root / "journal.sqlite3")
    if cfg.store.startswith(("postgresql://", "postgres://")):
        from tailguard.batch.postgres import PostgresJournal  # the optional extra, imported only when asked for
        return PostgresJournal(cfg.store)
    raise ValueError(f"batches.store must be 'sqlite' or a postgresql:// URL, got {cfg.store!r}")


def batches_lifecycle(live_cfg: Callable[[web.Application], BatchesConfig], requests: web.AppKey[Lifecycle],
                      dispatcher: web.AppKey[Dispatcher], metrics: web.AppKey[GatewayMetrics],
                      state_dir: web.AppKey[Path]) -> Callable[[web.Application], AsyncIterator[None]]:
    """The cleanup context that opens the journal and runs the runner while the app runs; without
    `batches.dir`, the journal and files go in `batches/` of the gateway's state directory."""

    async def running(app: web.Application) -> AsyncIterator[None]:
        cfg = live_cfg(app)
        state = app.get(state_dir)
        root = cfg.dir or (state / "batches" if state is not None else None)
        if not cfg.enabled or root is None:
            yield
            return
        journal = journal_for(cfg, root)
        await journal.open()
        classes = app[requests].classes
        cls = cfg.line_class or _lowest(classes.intake.tier_class("flex"))
        front = GatewayFront(lambda: app[requests], app[dispatcher], cls, cfg.ahead)
        runner = Runner(journal, FileStore(root), front, cfg)
        app[SERVICE] = Batches(journal, runner.files, runner, cfg, lambda key: app[requests].classes.authenticate(key))
        app[metrics].registry.register(BatchCollector(runner))
        runner.start()
        try:
            yield
        finally:
            await runner.stop()
            await journal.close()

    return running


def _lowest(spec: Any) -> str:
    return str(spec.name) if spec is not None else "batch"


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", _upload)
    app.router.add_get("/v1/files", _list_files)
    app.router.add_get("/v1/files/{id}", _get_file)
    app.router.add_get("/v1/files/{id}/content", _file_content)
    app.router.add_delete("/v1/files/{id}", _delete_file)
    app.router.add_post("/v1/batches", _create)
    app.router.add_get("/v1/batches", _list_batches)
    app.router.add_get("/v1/batches/{id}", _get_batch)
    app.router.add_post("/v1/batches/{id}/cancel", _cancel)
    app.router.add_post("/v1/batches/{id}/retry", _retry)


def _service(request: web.Request) -> Batches:
    svc = request.app.get(SERVICE)
    if svc is None:
        raise NotFound("Batches are not enabled on this gateway: they need somewhere to keep files and their journal "
                       "(serve with a config file, which has a state directory beside it, or give `tailguard serve "
                       "--state-dir DIR`, or set batches.dir).", code="batches_disabled")
    return svc


def _json(body: Any) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")


# --- files ---

async def _upload(request: web.Request) -> web.Response:
    svc = _service(request)
    owner = svc.owner(request)
    if not request.content_type.startswith("multipart/"):
        raise BadRequest("Upload a file as multipart/form-data with fields `purpose` and `file`.", code="invalid_body")
    reader = await request.multipart()
    purpose, filename, size, fid = None, None, None, new_id("file-")
    try:
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise BadRequest("Nested multipart bodies are not accepted.", code="invalid_body")
            if part.name == "purpose":
                purpose = (await part.read(decode=True))[:64].decode(errors="replace")
            elif part.name == "file" and size is None:
                filename = (part.filename or "upload.jsonl")[:255]
                size = await svc.files.save(fid, _lines_within(part, svc.cfg.max_lines), svc.cfg.max_file_bytes)
            else:
                await part.release()
        if size is None:
            raise BadRequest("The upload has no `file` field.", param="file", code="missing_required_parameter")
        if purpose != "batch":
            raise BadRequest(f"purpose must be 'batch', got {purpose!r}.", param="purpose", code="invalid_value")
    except BaseException:
        await svc.files.delete(fid)
        raise
    now = int(time.time())
    rec = FileRecord(fid, owner, purpose, filename or "upload.jsonl", size, now, now + int(svc.cfg.file_retention_s))
    await svc.journal.add_file(rec)
    return _json(rec.to_openai())


async def _lines_within(part: BodyPartReader, max_lines: int) -> AsyncIterator[bytes]:
    """The part's bytes, refused (400) past `max_lines` lines."""
    lines = 0
    while chunk := await part.read_chunk(256 * 1024):
        lines += chunk.count(b"\n")
        if lines > max_lines:
            raise BadRequest(f"The file has more than {max_lines} lines.", param="file", code="too_many_lines")
        yield chunk


async def _list_files(request: web.Request) -> web.Response:
    svc = _service(request)
    owner = svc.owner(request)
    limit = _limit(request, 10_000, 10_000)
    found = await svc.journal.list_files(owner, request.query.get("purpose"), request.query.get("after"), limit + 1)
    return _json(_page([f.to_openai() for f in found], limit))


async def _get_file(request: web.Request) -> web.Response:
    svc = _service(request)
    return _json((await svc.file_of(svc.owner(request), request.match_info["id"])).to_openai())


async def _file_content(request: web.Request) -> web.Response:
    svc = _service(request)
    f = await svc.file_of(svc.owner(request), request.match_info["id"])
    return web.Response(body=await svc.files.read(f.id), content_type="application/jsonl")


async def _delete_file(request: web.Request) -> web.Response:
    svc = _service(request)
    f = await svc.file_of(svc.owner(request), request.match_info["id"])
    await svc.files.delete(f.id)
    await svc.journal.delete_file(f.id)
    return _json({"id": f.id, "object": "file", "deleted": True})


# --- batches ---

async def _create(request: web.Request) -> web.Response:
    svc = _service(request)
    owner, owner_key = svc.owner_and_key(request)
    body = await _body(request)
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}.", param="endpoint", code="invalid_value")
    window_s = _window_s(body.get("completion_window"), svc.cfg.max_window_s)
    metadata = _metadata(body.get("metadata"))
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise BadRequest("input_file_id is required.", param="input_file_id", code="missing_required_parameter")
    f = await svc.journal.get_file(file_id)
    if f is None or f.owner != owner or f.purpose != "batch":
        raise BadRequest(f"No batch input file with id {file_id!r}.", param="input_file_id", code="invalid_value")
    now = int(time.time())
    rec = BatchRecord(new_id("batch_"), owner, endpoint, file_id, body["completion_window"], "validating", now,
                      now + window_s, metadata, owner_key=owner_key)
    await svc.journal.add_batch(rec)
    svc.runner.wake()
    return _json(rec.to_openai())


async def _list_batches(request: web.Request) -> web.Response:
    svc = _service(request)
    limit = _limit(request, 20, 100)
    found = await svc.journal.list_batches(svc.owner(request), request.query.get("after"), limit + 1)
    return _json(_page([b.to_openai() for b in found], limit))


async def _get_batch(request: web.Request) -> web.Response:
    svc = _service(request)
    return _json((await svc.batch_of(svc.owner(request), request.match_info["id"])).to_openai())


async def _cancel(request: web.Request) -> web.Response:
    svc = _service(request)
    b = await svc.batch_of(svc.owner(request), request.match_info["id"])
    moved = await svc.journal.transition(b.id, ("validating", "in_progress"), "cancelling", int(time.time()))
    if moved is None and b.status not in ("cancelling", "cancelled"):
        raise APIError(f"Cannot cancel a batch with status '{b.status}'.", status=409, type="invalid_request_error",
                       code="invalid_state")
    svc.runner.wake(b.id)
    return _json((await svc.batch_of(b.owner, b.id)).to_openai())


async def _retry(request: web.Request) -> web.Response:
    """Our extension: a new batch of exactly the lines of this one that ended in its error file
    (failed, expired or cancelled), linked both ways through `metadata`. The body may give a new
    `completion_window` (default: the original's)."""
    svc = _service(request)
    b = await svc.batch_of(svc.owner(request), request.match_info["id"])
    asked = await _body(request) if request.can_read_body else {}
    window = asked.get("completion_window", b.completion_window)
    window_s = _window_s(window, svc.cfg.max_window_s)
    if b.status not in FINAL:
        raise APIError(f"Batch {b.id} is still {b.status}: retry it once it has ended.", status=409,
                       type="invalid_request_error", code="invalid_state")
    failed = await svc.journal.failed_lines(b.id)
    if not failed:
        raise BadRequest(f"Batch {b.id} has no failed lines to retry.", code="nothing_to_retry")
    data = b"".join(orjson.dumps({"custom_id": cid, "method": "POST", "url": b.endpoint,
                                  "body": orjson.Fragment(body)}) + b"\n" for cid, body in failed)
    now = int(time.time())
    fid = new_id("file-")
    size = await svc.files.write(fid, data)
    await svc.journal.add_file(FileRecord(fid, b.owner, "batch", f"{b.id}_retry.jsonl", size, now,
                                          now + int(svc.cfg.file_retention_s)))
    new = BatchRecord(new_id("batch_"), b.owner, b.endpoint, fid, window, "validating", now,
                      now + window_s, {**(b.metadata or {}), "retry_of": b.id}, owner_key=b.owner_key)
    await svc.journal.add_batch(new)
    await svc.journal.transition(b.id, (b.status,), b.status, None, {"metadata": {**(b.metadata or {}),
                                                                                  "retried_as": new.id}})
    svc.runner.wake()
    return _json(new.to_openai())


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise BadRequest("Request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.", code="invalid_json")
    return body


def _window_s(window: object, most_s: float) -> int:
    m = _WINDOW.match(window) if isinstance(window, str) else None
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)] if m else 0
    if not 0 < seconds <= most_s:
        raise BadRequest(f"completion_window must be '24h' (or '<n>s|m|h' up to {most_s:g} s), got {window!r}.",
                         param="completion_window", code="invalid_value")
    return seconds


def _metadata(meta: object) -> dict[str, str] | None:
    if meta is None:
        return None
    if (not isinstance(meta, dict) or len(meta) > _MAX_METADATA
            or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                       for k, v in meta.items())):
        raise BadRequest(f"metadata must be at most {_MAX_METADATA} string pairs (keys up to 64 characters, values "
                         "up to 512).", param="metadata", code="invalid_value")
    return meta


def _limit(request: web.Request, default: int, most: int) -> int:
    raw = request.query.get("limit")
    try:
        limit = default if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise BadRequest(f"limit must be between 1 and {most}.", param="limit", code="invalid_value")
    return limit


def _page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: `data`, `first_id`, `last_id`, `has_more`."""
    data = items[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(items) > limit}

