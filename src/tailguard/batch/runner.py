"""Runs every active batch to its end: validates its input, claims its lines from the journal as
the front has room for them, runs each through the gateway's own request path as the batch
class, records each result as it comes, retries transient failures with backoff, and writes the
output and error files. Nothing lives only in memory: a runner that dies is replaced by the
next one reading the same journal (docs/batch.md, "What survives what").

The runner consumes a `RequestPath` (the gateway's side, built in `gateway/http/batches.py`): how
many lines may enter now, and running one. Keeping only `ahead` lines waiting in the batch
class's queue, and adding one whenever fewer wait, lets the front's own slots and preemption
decide how many run, instead of a fixed number (llm-d's batch gateway polls the scheduler's
fullness from outside for the same end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import orjson

from tailguard.batch.files import FileStore
from tailguard.batch.journal import Journal
from tailguard.batch.records import BatchRecord, FileRecord, Line, new_id, output_line
from tailguard.batch.validation import check
from tailguard.config import BatchesConfig
from tailguard.retry_policy import RetryAfter, RetryPolicy

log = logging.getLogger("tailguard.gateway")

_TICK_S = 0.05  # how often a running batch looks again for room in the front
_RATE_SAMPLES = 60  # polls the ETA's pace is measured over
_MAX_DELAY_S = 60.0  # the longest a line waits before its next attempt


@dataclass(frozen=True, slots=True)
class Answer:
    """What one line got: the status and body its client would have got, and the request's id.
    `wait_s` is set when its owner's own rate limit refused it before it ran: it is run again
    after that wait, and the refusal is not one of its attempts."""

    status: int
    body: bytes
    request_id: str
    wait_s: float | None = None


class RequestPath(Protocol):
    def room(self) -> int:
        """How many more lines may enter the front now."""
        ...

    async def run(self, line: Line, endpoint: str, owner_key: str | None) -> Answer:
        """Run the line as a request of the key whose digest is `owner_key` (None: of no key)."""
        ...

    def enqueued_limit(self, owner_key: str | None) -> int | None:
        """The key's `batch_enqueued_tokens_limit`; None when it has none."""
        ...


class Runner:
    """Starts a task per active batch (found in the journal every `poll_s`, or told by `wake`)."""

    def __init__(self, journal: Journal, files: FileStore, front: RequestPath, cfg: BatchesConfig) -> None:
        self.journal, self.files, self.front, self.cfg = journal, files, front, cfg
        self.holder = f"{os.uname().nodename}-{os.getpid()}-{os.urandom(4).hex()}"
        # A transient failure (`retry_policy.RETRY_STATUSES`) waits out a full-jitter backoff, the
        # client's own rule, and is tried again up to `line_attempts` times in all.
        self.retry = RetryPolicy(max_attempts=cfg.line_attempts, base_delay=cfg.retry_base_s, max_delay=_MAX_DELAY_S)
        self.rng = random.Random()
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._wakes: dict[str, asyncio.Event] = {}
        self._found = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0  # line attempts handed to the front by this process (a metric)
        self.tokens = {"prompt": 0, "completion": 0}  # what this process's lines used (a metric)
        self.lines_by_state: dict[str, int] = {}  # of the active batches, as of the last poll (a metric)
        self.batches_by_status: dict[str, int] = {}
        self.ended = 0  # lines this process recorded done or failed
        self.validating = asyncio.Lock()  # one batch at a time: each counts the enqueued tokens of the others
        self._rate_samples: deque[tuple[float, int]] = deque(maxlen=_RATE_SAMPLES)

    def eta_s(self) -> float | None:
        """Seconds until the open lines of the active batches are done at this process's pace over
        the last minute or so; None before there is a pace to go by."""
        if len(self._rate_samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._rate_samples[0], self._rate_samples[-1]
        if n1 <= n0 or t1 <= t0:
            return None
        open_lines = self.lines_by_state.get("queued", 0) + self.lines_by_state.get("running", 0)
        return open_lines / ((n1 - n0) / (t1 - t0))

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name="batch-runner")

    async def stop(self) -> None:
        """Stop every run; the lines this process was running are queued again at once (another
        replica, or this gateway's next start, runs them without waiting for their leases)."""
        tasks = [t for t in (self._task, *self._runs.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        with contextlib.suppress(Exception):
            await self.journal.release(self.holder)

    def wake(self, batch_id: str | None = None) -> None:
        """A batch was created or asked to cancel: act now rather than at the next poll."""
        if batch_id is not None and batch_id in self._wakes:
            self._wakes[batch_id].set()
        self._found.set()

    async def _supervise(self) -> None:
        """Every `poll_s` while batches are active; with none, every third of a lease (a batch
        made here wakes it at once, and one made by another replica or left by a dead one is
        found within a third of the lease its lines wait out anyway), so an idle gateway does
        not read its journal every second (about 1M instructions a second, `gateway_profile.py`).
        The leases of the lines running here are renewed every third of a lease whatever `poll_s`
        is, and before the other reads: renewed only once per poll, after them, a 2 s lease lapsed
        on a loaded CI machine and the replica's own line was claimed and sent again."""
        last_renew = 0.0
        third = self.cfg.lease_s / 3
        while True:
            active: list[str] = []
            try:
                now = time.time()
                if now - last_renew >= third:  # first: a slow read below must not let a lease lapse
                    last_renew = now
                    await self.journal.renew(self.holder, now, self.cfg.lease_s)
                    await self._expire_files(int(now))
                active = await self.journal.active_batches()
                for batch_id in active:
                    if batch_id not in self._runs:
                        self._wakes[batch_id] = asyncio.Event()
                        self._runs[batch_id] = asyncio.create_task(self._guarded(batch_id), name=f"batch-{batch_id}")
                self.lines_by_state, self.batches_by_status = await self.journal.tally()
                self._rate_samples.append((time.time(), self.ended))
            except Exception:
                log.exception("batch runner: reading the journal failed; trying again")
            self._found.clear()
            pause = self.cfg.poll_s if active or self._runs else max(self.cfg.poll_s, third)
            if self._runs:  # lines may run here: their leases are renewed every third of one, whatever poll_s is
                pause = min(pause, max(0.0, last_renew + third - time.time()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._found.wait()

    async def _guarded(self, batch_id: str) -> None:
        try:
            await BatchRun(self, batch_id, self._wakes[batch_id]).run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s: its run stopped; it resumes at the next poll", batch_id)
            await asyncio.sleep(self.cfg.poll_s)
        finally:
            self._runs.pop(batch_id, None)
            self._wakes.pop(batch_id, None)

    async def _expire_files(self, now: int) -> None:
        for f in await self.journal.expired_files(now):
            await self.files.delete(f.id)
            await self.journal.delete_file(f.id)


class BatchRun:
    """One batch, from wherever the journal says it stands to a final status."""

    def __init__(self, runner: Runner, batch_id: str, wake: asyncio.Event) -> None:
        self.r, self.id, self.wake = runner, batch_id, wake
        self.j = runner.journal
        self.lines: set[asyncio.Task[None]] = set()
        self.paused_until = 0.0  # its owner's rate limit refused a line: no more lines before this

    async def run(self) -> None:
        rec = await self.j.get_batch(self.id)
        if rec is None:
            return
        if rec.status == "validating":
            rec = await self._validate(rec)
        try:
            while rec is not None and rec.status == "in_progress":
                rec = await self._step(rec)
        finally:
            await self._drop_lines()
        if rec is not None and rec.status in ("finalizing", "cancelling"):
            await self._finalize(rec)

    async def _validate(self, rec: BatchRecord) -> BatchRecord | None:
        """Every line checked (on a thread: a 50,000-line file would hold the event loop), and the
        tokens they may use counted against the key's enqueued limit (OpenAI's
        `token_limit_exceeded`), before the lines are recorded and the batch starts."""
        now = int(time.time())
        try:
            data = await self.r.files.read(rec.input_file_id)
        except FileNotFoundError:  # deleted after the batch was made
            return await self._fail(now, "file_not_found", f"The input file {rec.input_file_id} no longer exists.",
                                    "input_file_id")
        checked = await asyncio.to_thread(check, data, rec.endpoint, self.r.cfg.max_lines)
        if checked.errors:
            return await self.j.transition(self.id, ("validating",), "failed", now, {"errors": checked.errors})
        async with self.r.validating:
            limit = self.r.front.enqueued_limit(rec.owner_key)
            held = await self.j.enqueued_tokens(rec.owner) if limit is not None else 0
            if limit is not None and held + checked.tokens > limit:
                return await self._fail(now, "token_limit_exceeded", (
                    f"Enqueued token limit reached for this API key. Limit: {limit:,} enqueued tokens; this batch "
                    f"needs {checked.tokens:,} and the key's batches in progress hold {held:,}. Please try again "
                    "once some in_progress batches have been completed."), None)
            await self.j.start(self.id, checked.lines, now, checked.tokens)
        return await self.j.get_batch(self.id)

    async def _fail(self, now: int, code: str, message: str, param: str | None) -> BatchRecord | None:
        return await self.j.transition(self.id, ("validating",), "failed", now, {"errors": [{
            "code": code, "message": message, "param": param, "line": None}]})

    async def _step(self, rec: BatchRecord) -> BatchRecord | None:
        """Room in the front -> claimed lines started; then wait for a line's end, a wake or a tick."""
        now = time.time()
        if now >= rec.expires_at:
            await self._drop_lines()
            await self.j.close_open(self.id, "batch_expired", "This request could not be executed before the "
                                    "completion window expired.")
            await self._finalize(rec, "expired")
            return None
        # Add lines until `ahead` of them wait: lines that find a free slot start at once and leave
        # the queue short, so this goes on while slots are free and stops when they are not.
        while now >= self.paused_until and (room := self.r.front.room()) > 0:
            claimed = await self.j.claim(self.id, room, self.r.holder, now, self.r.cfg.lease_s)
            for line in claimed:
                task = asyncio.create_task(self._line(line, rec.endpoint, rec.owner_key))
                self.lines.add(task)
                task.add_done_callback(self.lines.discard)
            await asyncio.sleep(0)  # the new lines enter the front before the next look at its room
            if len(claimed) < room:
                break  # no more lines are due now
        if not self.lines and await self.j.open_lines(self.id) == 0:
            return await self.j.transition(self.id, ("in_progress",), "finalizing", int(time.time()))
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_TICK_S):
                await self.wake.wait()
        # Its status only (a cancel), not its counts: a count of every line on each step would cost
        # more than the lines it paces.
        return rec if await self.j.status(self.id) == rec.status else await self.j.get_batch(self.id)

    async def _line(self, line: Line, endpoint: str, owner_key: str | None) -> None:
        """One attempt of one line, its result (or its retry) recorded before anything else."""
        self.r.sent += 1
        try:
            answer = await self.r.front.run(line, endpoint, owner_key)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the gateway's own failure: the line could not run now
            log.exception("batch %s line %s failed in the gateway", self.id, line.custom_id)
            answer = Answer(503, orjson.dumps({"error": {"message": str(e), "type": "server_error"}}), "")
        if answer.wait_s is not None:  # paced by its owner's limits, as the owner's own requests are
            self.paused_until = max(self.paused_until, time.time() + answer.wait_s)
            await self.j.again(line, self.r.holder, self.paused_until, attempted=False)
        elif isinstance(again := self.r.retry.decide(line.attempts, answer.status, None, self.r.rng), RetryAfter):
            await self.j.again(line, self.r.holder, time.time() + again.delay_s)
        else:
            ok = 200 <= answer.status < 300
            try:
                body = orjson.loads(answer.body)
            except orjson.JSONDecodeError:
                body = {"error": {"message": answer.body[:1000].decode(errors="replace"), "type": "server_error"}}
            self._count_usage(body)
            result = output_line(line.custom_id, answer.status, body, answer.request_id)
            if await self.j.finish(line, self.r.holder, ok, orjson.dumps(result)):
                self.r.ended += 1
        self.wake.set()

    def _count_usage(self, body: object) -> None:
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict):
            for kind in ("prompt", "completion"):
                n = usage.get(f"{kind}_tokens")
                if isinstance(n, int):
                    self.r.tokens[kind] += n

    async def _drop_lines(self) -> None:
        """Stop this run's lines (a cancel, an expiry, shutdown); their upstream requests end."""
        for t in list(self.lines):
            t.cancel()
        for t in list(self.lines):
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _finalize(self, rec: BatchRecord, final: str | None = None) -> None:
        """Write the output and error files from the journal, then the final status. A batch being
        cancelled has its unfinished lines ended as `batch_cancelled` first."""
        if rec.status == "cancelling":
            await self._drop_lines()
            await self.j.close_open(self.id, "batch_cancelled", "This request was cancelled before it ran.")
            final = "cancelled"
        final = final or "completed"
        out, err = await asyncio.to_thread(_files_of, await self.j.results(self.id))  # 50,000 lines: off the loop
        now = int(time.time())
        ids = {"output_file_id": await self._file(rec, out, now, "output") if out else None,
               "error_file_id": await self._file(rec, err, now, "error") if err else None}
        ended = await self.j.transition(self.id, (rec.status,), final, now, ids)
        if ended is not None:
            done = await self.j.get_batch(self.id)
            total, completed = (done.total, done.completed) if done is not None else (0, 0)
            log.info("batch %s %s: %d of %d lines completed", self.id, final, completed, total,
                     extra={"event": "batch", "fields": {"batch": self.id, "status": final, "total": total,
                                                         "completed": completed, "failed": total - completed}})
        else:
            for fid in ids.values():  # another replica finished it first: its files stand
                if fid is not None:
                    await self.r.files.delete(fid)
                    await self.j.delete_file(fid)

    async def _file(self, rec: BatchRecord, data: bytes, now: int, kind: str) -> str:
        fid = new_id("file-")
        size = await self.r.files.write(fid, data)
        await self.j.add_file(FileRecord(fid, rec.owner, "batch_output", f"{rec.id}_{kind}.jsonl", size, now,
                                         now + int(self.r.cfg.file_retention_s)))
        return fid


def _files_of(results: list[tuple[bool, bytes]]) -> tuple[bytes, bytes]:
    """The output and error files' bytes: each line's recorded result, in order, to its file."""
    out, err = bytearray(), bytearray()
    for ok, result in results:
        (out if ok else err).extend(result + b"\n")
    return bytes(out), bytes(err)
