"""The audit trail's writer: entries handed over by the event loop (`add`, one bounded deque
append) and written by a thread of its own every `flush_s`, linked into this gateway's chain, in
one transaction per batch; retention by age and count once an hour. Writing never blocks a
request: the loop never waits for the store, and a full queue says so at once (`full`), so the
gateway can drop the entry (the trail then records a `gap` entry: how many, since when) or
refuse the request (`audit.when_full`), counted either way.

    trail = Trail(store, "gw-1:8080", queue_entries=10_000)
    trail.start()
    trail.add({"kind": "request", ...})        # False when the queue was full and it was dropped
    trail.close()                              # the last entries written, the thread joined
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from tailguard.audit.chain import GENESIS, Entry, Head, entry
from tailguard.audit.store import AuditStore

log = logging.getLogger("tailguard.gateway")

PRUNE_S = 3600.0  # retention runs this often (and at start), and the chain's head is logged
_SAY_S = 60.0  # a full queue or a failing store is logged at most this often
TEXT_FIELDS = ("prompt", "completion")  # the retained text of a request entry, redacted before it is written


class Trail:
    def __init__(self, store: AuditStore, chain: str, *, queue_entries: int = 10_000, flush_s: float = 0.2,
                 max_age_s: float = 365 * 86400.0, max_entries: int = 10_000_000,
                 redact: Callable[[str], str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store, self.chain = store, chain
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._max = queue_entries
        self._flush_s, self._max_age_s, self._max_entries = flush_s, max_age_s, max_entries
        self.redact, self._clock = redact, clock  # (a reload swaps `redact`)
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the drop counters, shared by the loop and the writer
        self._gap: tuple[int, float, float] | None = None  # dropped since the last write: (n, first, last)
        self._unwritten: list[Entry] = []  # a batch the store refused, tried again first
        self._reconnect = False  # the last write failed: its connection is made anew before the next
        self._said: dict[str, float] = {}
        seq_hash = store.head(chain)
        self._seq, self._prev = seq_hash if seq_hash is not None else (0, GENESIS)
        self.written = 0
        self.dropped = 0
        self.failures = 0

    # --- the loop's side ------------------------------------------------------------------------

    def full(self) -> bool:
        return len(self._queue) >= self._max

    def queued(self) -> int:
        return len(self._queue)

    def add(self, doc: dict[str, Any]) -> bool:
        """Queue one entry, stamped now (`at_unix`; the writer adds `at`, the same instant in
        RFC 3339); False when the queue is full and the entry was dropped."""
        now = self._clock()
        doc["at_unix"] = round(now, 6)
        if len(self._queue) >= self._max:
            with self._lock:
                n, first, _ = self._gap or (0, now, now)
                self._gap = (n + 1, first, now)
                self.dropped += 1
            self._say("full", f"audit trail queue full ({self._max} entries): entries are dropped (a gap entry "
                      "records how many; tailguard_audit_dropped_total counts them)")
            return False
        self._queue.append(doc)
        return True

    # --- the writer thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tailguard-audit", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write what is queued and stop the thread (and log the chain's head)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        else:
            self.flush()
        self.store.close()

    def _run(self) -> None:
        pruned_at = 0.0
        while True:
            self._wake.wait(self._flush_s)
            self._wake.clear()
            stopping = self._stop
            self.flush()
            now = self._clock()
            if now - pruned_at >= PRUNE_S or stopping:
                pruned_at = now
                if not stopping:
                    self.prune()
                self.log_head()
            if stopping:
                return

    def flush(self) -> int:
        """Write the queued entries (after any the store refused before); the number written."""
        before = len(self._unwritten)
        if before and not self._write(self._unwritten):
            return 0
        batch: list[Entry] = []
        while self._queue:
            batch.append(self._link(self._queue.popleft()))
        with self._lock:
            gap, self._gap = self._gap, None
        if gap is not None:
            n, first, last = gap
            batch.append(self._link({"kind": "gap", "dropped": n, "first_dropped_at": _rfc3339(first),
                                     "last_dropped_at": _rfc3339(last), "at_unix": round(last, 6)}))
        if not batch:
            return before
        self._unwritten = batch
        return before + len(batch) if self._write(batch) else before

    def _link(self, doc: dict[str, Any]) -> Entry:
        doc["at"] = _rfc3339(doc["at_unix"])
        redact = self.redact
        if redact is not None:
            for name in TEXT_FIELDS:
                text = doc.get(name)
                if isinstance(text, str):
                    doc[name] = redact(text)
        self._seq += 1
        e = entry(self.chain, self._seq, self._prev, doc)
        self._prev = e.hash
        return e

    def _write(self, batch: list[Entry]) -> bool:
        try:
            if self._reconnect:  # (a PostgreSQL restarted meanwhile left the old connection dead)
                self.store.close()
                self.store.open()
                self._reconnect = False
            self.store.append(batch)
        except Exception as e:
            self.failures += 1
            if self._taken(e, batch):
                return self._write(self._unwritten)
            self._reconnect = True
            self._say("store", f"audit trail: writing {len(batch)} entries failed ({type(e).__name__}: {e}); "
                      "they are tried again, and new entries queue meanwhile")
            return False
        self.written += len(batch)
        self._unwritten = []
        return True

    def _taken(self, error: Exception, batch: list[Entry]) -> bool:
        """Another process writes this chain (a number already taken): this one moves to a chain
        of its own and its batch is linked there; True when it moved."""
        if "unique" not in str(error).lower() and "duplicate" not in str(error).lower():
            return False
        old, self.chain = self.chain, f"{self.chain}~{os.getpid()}"
        log.error("audit trail: another process writes chain %s; this gateway continues as chain %s", old, self.chain)
        seq_hash = self.store.head(self.chain)
        self._seq, self._prev = seq_hash if seq_hash is not None else (0, GENESIS)
        self._unwritten = [self._link(e.fields()) for e in batch]
        return True

    def prune(self) -> int:
        """Retention: entries older than `max_age_s`, and past `max_entries`, deleted."""
        try:
            return self.store.prune(self.chain, self._clock() - self._max_age_s, self._max_entries)
        except Exception as e:
            self._say("prune", f"audit trail: retention failed ({type(e).__name__}: {e})")
            return 0

    def head(self) -> Head:
        return Head(self.chain, self._seq, self._prev, self.written)

    def log_head(self) -> None:
        """The chain's head into the gateway's log, where it outlives the store: a chain cut off at
        its end is found by checking a head logged earlier (`tailguard audit verify --head`)."""
        h = self.head()
        log.info("audit chain %s at entry %d: %s", h.chain, h.seq, h.hash,
                 extra={"event": "audit_head", "fields": {"chain": h.chain, "seq": h.seq, "hash": h.hash}})

    def _say(self, what: str, message: str) -> None:
        now = self._clock()
        if now - self._said.get(what, -_SAY_S) >= _SAY_S:
            self._said[what] = now
            log.error(message)


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
