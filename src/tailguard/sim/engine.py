"""A continuous-batching engine in the shape of vLLM's V1 scheduler; pure, no I/O.

Each `step(now)` is one forward pass. It schedules, within `max_num_batched_tokens`:
1. every running sequence that is decoding (one token each), taking a new KV block for those
   whose context crosses a block boundary; when no block is free, the newest running request
   (FCFS) or the one with the largest `(priority, arrival)` (priority policy) is preempted: its
   blocks are freed and it goes back to the front of the waiting queue to be recomputed later;
2. the next chunk of every running request still in prefill (chunked prefill);
3. if nothing was preempted, waiting requests in order (FCFS, or lowest `priority` then arrival),
   while a sequence slot (`max_num_seqs`), token budget and KV blocks for the first chunk are
   available; cached prefix blocks are reused without prefill. A head that does not fit blocks
   the queue, as in vLLM.
The step's duration comes from the cost model; at its end each decoding sequence, and each
sequence whose prefill just completed, has one more output token. Nothing leaves before a
sequence's prefill completes, and a request asked for `max_tokens` gets exactly that many
(unless the config draws shorter outputs).

Speed: a decoding sequence is not touched on steps where nothing happens to it. Its output count
is derived from the global step number, and two heaps hold the steps at which it needs a new
KV block (every `block_size` tokens) and at which it finishes. A step costs O(events * log n)
plus copying the ids of the decoding sequences, which is what lets the discrete-event run handle
100,000 requests in seconds. Tokens are reported as `Step.emitted` (request ids, one token each)
rather than one event object per token.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Union

from tailguard.sim.cost import EngineConfig
from tailguard.sim.kv import KVCache


@dataclass(slots=True, frozen=True)
class SimRequest:
    """A request as the engine sees it. `block_hashes` are the prefix-cache keys of the prompt's
    leading full blocks (`tailguard.sim.kv.*_block_hashes`); blocks past them are never shared.
    The engine stamps the arrival instant from the `now` given to `add`."""

    id: str
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    block_hashes: tuple[int, ...] = ()
    # Names the request's own content past `block_hashes` (0 <= kv_key < 2**30). Blocks it leaves
    # cached when it ends or is aborted can be found by a later request with the same kv_key: the
    # gateway's continuation of a suspended request, whose prompt is the original's prompt and
    # output, as vLLM's prefix cache finds them by the token ids. None: nobody else can have them.
    kv_key: int | None = None


@dataclass(slots=True, frozen=True)
class Admitted:
    """First scheduled (queue_s from arrival) or, with `resumed`, rescheduled after preemption."""

    req_id: str
    queue_s: float
    cached_tokens: int
    resumed: bool


@dataclass(slots=True, frozen=True)
class FirstToken:
    """The request's prefill completed and its first output token is in `Step.emitted`."""

    req_id: str


@dataclass(slots=True, frozen=True)
class Preempted:
    """KV ran out: the request lost its blocks and waits to be recomputed."""

    req_id: str
    output_tokens: int


@dataclass(slots=True, frozen=True)
class RequestFinished:
    """The request's last token is in this step's `emitted`; its slot and blocks are free."""

    req_id: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str  # "length" (max_tokens or max_model_len reached) | "stop" (drawn shorter)
    preemptions: int


Event = Union[Admitted, FirstToken, Preempted, RequestFinished]


@dataclass(slots=True, frozen=True)
class Step:
    """One forward pass starting at `started_at`; tokens and events take effect at `ended_at`."""

    started_at: float
    duration_s: float
    emitted: tuple[str, ...]  # ids that got exactly one new output token in this step
    events: tuple[Event, ...]  # in order: Preempted/Admitted while scheduling, then FirstToken, RequestFinished
    prefill_tokens: int
    decode_seqs: int
    kv_tokens_read: int

    @property
    def ended_at(self) -> float:
        return self.started_at + self.duration_s


_WAITING, _PREFILL, _DECODE, _GONE = 0, 1, 2, 3
# Content keys are 63-bit; bit 63 set keeps a request's own block keys apart from them, and bit 62
# tells keys named by a request's `kv_key` from keys only its own sequence number makes.
_OWN_KEY = 1 << 63
_NAMED_KEY = 1 << 62
_MAX_KV_KEY = 1 << 30


class _Seq:
    __slots__ = (
        "id", "prompt", "target", "length_reason", "priority", "arrived_at", "seqno", "shared",
        "state", "computed", "out", "base_step", "finish_step", "epoch", "run_order",
        "private", "held", "admitted", "preemptions", "own_keys", "finds_own",
    )

    def __init__(self, req: SimRequest, target: int, length_reason: str, arrived_at: float, seqno: int) -> None:
        self.id = req.id
        self.prompt = req.prompt_tokens
        self.target = target
        self.length_reason = length_reason
        self.priority = req.priority
        self.arrived_at = arrived_at
        self.seqno = seqno
        self.shared = req.block_hashes
        self.state = _WAITING
        self.computed = 0  # tokens with KV computed (prefill progress)
        self.out = 0  # output tokens; while decoding, the count at step `base_step`
        self.base_step = 0
        self.finish_step = 0
        self.epoch = 0  # bumped when the sequence leaves the decoding set: stale heap entries skip
        self.run_order = 0
        self.private = 0  # private KV blocks held
        self.held: dict[int, int] = {}  # block index -> cached key held
        self.admitted = False
        self.preemptions = 0
        if req.kv_key is None:
            self.own_keys = _OWN_KEY | (seqno << 32)
        elif 0 <= req.kv_key < _MAX_KV_KEY:
            self.own_keys = _OWN_KEY | _NAMED_KEY | (req.kv_key << 32)
        else:
            raise ValueError(f"kv_key {req.kv_key} is outside [0, 2**30)")
        self.finds_own = req.kv_key is not None  # a continuation may find its original's blocks

    def block_key(self, i: int) -> int:
        if i < len(self.shared):
            return self.shared[i]
        # Blocks nobody else can have computed (the rest of the prompt, the output) get a key only
        # this request (or its continuation) produces, so that after preemption it can find its
        # own released blocks.
        return self.own_keys | i


class Engine:
    """Pure continuous-batching engine: the discrete-event run and the HTTP server both drive it.

        engine = Engine(EngineConfig.from_preset("h100-llama8b"))
        engine.add(SimRequest("r1", prompt_tokens=512, max_tokens=64), now=0.0)
        t = 0.0
        while not engine.idle():
            step = engine.step(t)
            t = step.ended_at          # step.emitted / step.events happen at this instant
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.kv = KVCache(config.num_kv_blocks, config.enable_prefix_caching)
        self._bs = config.block_size
        self._priority = config.scheduling_policy == "priority"
        self._rng = random.Random(config.seed)
        self._seqs: dict[str, _Seq] = {}  # every request not finished or aborted
        self._fcfs: deque[_Seq] = deque()
        self._heap: list[tuple[int, float, int, _Seq]] = []  # priority policy: (priority, arrival, seqno)
        self._n_waiting = 0
        self._running: dict[str, _Seq] = {}  # admission order: the last is the newest
        self._prefilling: dict[str, _Seq] = {}
        self._decoding: dict[str, _Seq] = {}
        self._alloc_heap: list[tuple[int, int, int, _Seq]] = []  # (step, run_order, epoch, seq)
        self._finish_heap: list[tuple[int, int, int, _Seq]] = []
        self._step_no = 0
        self._ctx_sum = 0  # sum of (prompt + output) over decoding sequences at the current step
        self._seqno = 0
        self._run_order = 0
        # Counters, read by the metrics exporters.
        self.steps_total = 0
        self.preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_queried_tokens_total = 0
        self.prefix_hit_tokens_total = 0
        self.finished_total: dict[str, int] = {"length": 0, "stop": 0, "abort": 0}

    # --- driver interface --------------------------------------------------------------------

    def add(self, req: SimRequest, now: float) -> None:
        """Queue a request. Raises ValueError for what vLLM would answer with a 400."""
        if req.id in self._seqs:
            raise ValueError(f"request id {req.id!r} is already in the engine")
        if req.prompt_tokens < 1:
            raise ValueError("prompt_tokens must be >= 1")
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        room = self.config.max_model_len - req.prompt_tokens
        if room < 1:
            raise ValueError(
                f"prompt of {req.prompt_tokens} tokens leaves no room within max_model_len {self.config.max_model_len}"
            )
        target = self._draw_output(req.max_tokens)
        reason = "length" if target == req.max_tokens else "stop"
        if target > room:
            target, reason = room, "length"
        seq = _Seq(req, target, reason, now, self._seqno)
        self._seqno += 1
        self._seqs[req.id] = seq
        self._push_waiting(seq, front=False)

    def abort(self, req_id: str, now: float) -> bool:
        """The client left: free the request's slot and blocks at once. False if unknown/finished."""
        seq = self._seqs.pop(req_id, None)
        if seq is None:
            return False
        if seq.state == _WAITING:
            self._n_waiting -= 1  # lazily dropped from the queue when it reaches the head
        else:
            self._stop_running(seq)
        seq.state = _GONE
        self.finished_total["abort"] += 1
        return True

    def crash(self, now: float) -> None:
        """The engine's process died: every request it held is gone (counted as aborted) and so
        is its prefix cache; the other counters go on, so a run that restarts it reads them whole."""
        for req_id in list(self._seqs):
            self.abort(req_id, now)
        self.kv = KVCache(self.config.num_kv_blocks, self.config.enable_prefix_caching)

    def idle(self) -> bool:
        return not self._seqs

    def has(self, req_id: str) -> bool:
        """Whether `req_id` is in the engine (waiting or running)."""
        return req_id in self._seqs

    def output_tokens(self, req_id: str) -> int:
        """Tokens generated so far by a request in the engine (0 if unknown or not started)."""
        seq = self._seqs.get(req_id)
        return 0 if seq is None else self._out_now(seq)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._n_waiting

    def step(self, now: float) -> Step:
        """One engine iteration at `now`, as vLLM's scheduler runs it: grow the decodes, chunk
        the running prefills, admit waiting requests into what budget is left, then run."""
        events: list[Event] = []
        self._grow_decodes(events)
        preempted = bool(events)
        chunks, budget, preempted_for_prefill = self._chunk_prefills(events)
        preempted = preempted or preempted_for_prefill

        # Admit waiting requests, unless this step had to preempt (their blocks are needed).
        if self._n_waiting and (not preempted or (not self._decoding and not chunks)):
            budget = self._admit(now, budget, chunks, events)

        decode_seqs = len(self._decoding)
        prefill_tokens = 0
        kv_read = self._ctx_sum
        for _, chunk, before in chunks.values():
            prefill_tokens += chunk
            kv_read += before
        if not decode_seqs and not chunks:
            return Step(now, 0.0, (), tuple(events), 0, 0, 0)
        duration = self.config.cost.step_time(prefill_tokens, decode_seqs, kv_read)
        emitted = self._end_step(chunks, events)
        return Step(now, duration, tuple(emitted), tuple(events), prefill_tokens, decode_seqs, kv_read)

    def _grow_decodes(self, events: list[Event]) -> None:
        """Decoding sequences that cross a block boundary this step take one more block, making
        room by preemption (into `events`) when the pool is full."""
        s = self._step_no
        heap = self._alloc_heap
        while heap and heap[0][0] <= s:
            _, _, epoch, seq = heapq.heappop(heap)
            if seq.epoch != epoch:
                continue
            if self._make_room(1, seq, events):
                seq.private += 1
                nxt = s + self._bs
                if nxt <= seq.finish_step:
                    heapq.heappush(heap, (nxt, seq.run_order, epoch, seq))

    def _chunk_prefills(self, events: list[Event]) -> tuple[dict[str, tuple[_Seq, int, int]], int, bool]:
        """This step's chunks of running prefills, oldest first, within the token budget the
        decodes leave: (id -> (seq, chunk tokens, computed before), budget left, whether a
        chunk's blocks needed a preemption)."""
        bs = self._bs
        budget = self.config.max_num_batched_tokens - len(self._decoding)
        chunks: dict[str, tuple[_Seq, int, int]] = {}
        preempted = False
        for seq in list(self._prefilling.values()):
            if budget <= 0:
                break
            if seq.state != _PREFILL:
                continue  # preempted earlier in this loop
            chunk = min(seq.prompt + seq.out - seq.computed, budget)
            need = -(-(seq.computed + chunk) // bs) - seq.private - len(seq.held)
            n_events = len(events)
            ok = self._make_room(need, seq, events, chunks)
            if len(events) != n_events:
                preempted = True
                budget = self.config.max_num_batched_tokens - len(self._decoding) - sum(
                    c for _, c, _ in chunks.values()
                )
            if ok:
                seq.private += need
                chunks[seq.id] = (seq, chunk, seq.computed)
                budget -= chunk
        return chunks, budget, preempted

    def _end_step(self, chunks: dict[str, tuple[_Seq, int, int]], events: list[Event]) -> list[str]:
        """The step ends: every decoding sequence has one more token, prefill chunks are done
        (their full blocks promoted to the prefix cache), and finished sequences leave. Returns
        the ids that emitted a token."""
        s = self._step_no
        bs = self._bs
        kv = self.kv
        emitted = list(self._decoding)
        self._ctx_sum += len(emitted)
        self._step_no = s + 1
        self.steps_total += 1
        done_prefill: list[_Seq] = []
        for seq, chunk, before in chunks.values():
            seq.computed = before + chunk
            if kv.enable_prefix_caching and seq.shared:
                for i in range(before // bs, min(seq.computed // bs, len(seq.shared))):
                    if i not in seq.held and kv.promote(seq.shared[i]):
                        seq.held[i] = seq.shared[i]
                        seq.private -= 1
            if seq.computed == seq.prompt + seq.out:
                emitted.append(seq.id)
                seq.out += 1
                if seq.out == 1:
                    events.append(FirstToken(seq.id))
                    self.prompt_tokens_total += seq.prompt
                done_prefill.append(seq)
        self.generation_tokens_total += len(emitted)

        fh = self._finish_heap
        while fh and fh[0][0] <= s:
            _, _, epoch, seq = heapq.heappop(fh)
            if seq.epoch == epoch:
                self._finish(seq, events)
        for seq in done_prefill:
            del self._prefilling[seq.id]
            if seq.out >= seq.target:
                self._finish(seq, events)
            else:
                self._start_decoding(seq)
        return emitted

    # --- internals ---------------------------------------------------------------------------

    def _draw_output(self, max_tokens: int) -> int:
        mode = self.config.output_length
        if mode == "exact":
            return max_tokens
        if mode == "uniform":
            return self._rng.randint(1, max_tokens)
        mean = self.config.output_mean_ratio * max_tokens
        return min(max_tokens, 1 + int(self._rng.expovariate(1.0 / max(mean - 1.0, 1e-9))))

    def _out_now(self, seq: _Seq) -> int:
        if seq.state == _DECODE:
            return seq.out + self._step_no - seq.base_step
        return seq.out

    def _push_waiting(self, seq: _Seq, front: bool) -> None:
        seq.state = _WAITING
        self._n_waiting += 1
        if self._priority:
            heapq.heappush(self._heap, (seq.priority, seq.arrived_at, seq.seqno, seq))
        elif front:
            self._fcfs.appendleft(seq)
        else:
            self._fcfs.append(seq)

    def _peek_waiting(self) -> _Seq:
        if self._priority:
            h = self._heap
            while h[0][3].state != _WAITING:
                heapq.heappop(h)
            return h[0][3]
        q = self._fcfs
        while q[0].state != _WAITING:
            q.popleft()
        return q[0]

    def _pop_waiting(self) -> None:
        if self._priority:
            heapq.heappop(self._heap)
        else:
            self._fcfs.popleft()
        self._n_waiting -= 1

    def _admit(self, now: float, budget: int, chunks: dict[str, tuple[_Seq, int, int]], events: list[Event]) -> int:
        bs = self._bs
        kv = self.kv
        max_seqs = self.config.max_num_seqs
        running = self._running
        while self._n_waiting and budget > 0 and len(running) < max_seqs:
            seq = self._peek_waiting()
            total = seq.prompt + seq.out
            hit_blocks = evictable_hits = 0
            keys: list[int] = []
            if kv.enable_prefix_caching:
                # vLLM always computes at least the last token, so a full hit still prefills one.
                max_blocks = (total - 1) // bs
                keys = list(seq.shared[:max_blocks])
                if seq.preemptions or seq.finds_own:  # its own released blocks may still be cached
                    keys.extend(seq.block_key(i) for i in range(len(keys), max_blocks))
                hit_blocks, evictable_hits = kv.lookup(keys, max_blocks)
            hit_tokens = hit_blocks * bs
            chunk = min(total - hit_tokens, budget)
            need = -(-(hit_tokens + chunk) // bs) - hit_blocks
            if kv.free_blocks - evictable_hits < need:
                break  # the head does not fit: it waits, and so does everyone behind it
            self._pop_waiting()
            if hit_blocks:
                kv.acquire(keys[:hit_blocks])
                seq.held = {i: keys[i] for i in range(hit_blocks)}
            kv.allocate(need)
            seq.private = need
            seq.computed = hit_tokens
            seq.state = _PREFILL
            seq.run_order = self._run_order
            self._run_order += 1
            running[seq.id] = seq
            self._prefilling[seq.id] = seq
            if kv.enable_prefix_caching:
                self.prefix_queried_tokens_total += total
                self.prefix_hit_tokens_total += hit_tokens
            events.append(Admitted(seq.id, max(0.0, now - seq.arrived_at), hit_tokens, seq.admitted))
            seq.admitted = True
            chunks[seq.id] = (seq, chunk, hit_tokens)
            budget -= chunk
        return budget

    def _make_room(
        self, need: int, seq: _Seq, events: list[Event], chunks: dict[str, tuple[_Seq, int, int]] | None = None
    ) -> bool:
        """Allocate `need` blocks for `seq`, preempting others as vLLM does; False if `seq` itself
        had to be preempted."""
        while not self.kv.allocate(need):
            if self._priority:
                victim = max(self._running.values(), key=lambda q: (q.priority, q.arrived_at, q.seqno))
            else:
                victim = next(reversed(self._running.values()))
            if chunks is not None:
                chunks.pop(victim.id, None)
            self._preempt(victim, events)
            if victim is seq:
                return False
        return True

    def _stop_running(self, seq: _Seq) -> None:
        """Take a running sequence (preempted or aborted) out of the batch and release its blocks.
        With prefix caching its computed full blocks stay cached, as vLLM's do until evicted, so
        its recompute or its continuation finds them; the newest token's KV is not computed yet."""
        kv_tokens = seq.computed if seq.state == _PREFILL else seq.prompt + self._out_now(seq) - 1
        self._leave_running(seq)  # also fixes `seq.out` at the tokens generated so far
        self._free(seq, kv_tokens if self.kv.enable_prefix_caching else 0)

    def _preempt(self, seq: _Seq, events: list[Event]) -> None:
        self._stop_running(seq)
        seq.computed = 0
        seq.preemptions += 1
        self.preemptions_total += 1
        self._push_waiting(seq, front=True)
        events.append(Preempted(seq.id, seq.out))

    def _leave_running(self, seq: _Seq) -> None:
        del self._running[seq.id]
        if seq.state == _DECODE:
            out = self._out_now(seq)
            self._ctx_sum -= seq.prompt + out
            seq.out = out
            del self._decoding[seq.id]
            seq.epoch += 1
        else:
            self._prefilling.pop(seq.id, None)
        seq.state = _GONE  # the caller sets where it goes next; `out` is no longer derived

    def _free(self, seq: _Seq, cache_tokens: int) -> None:
        """Release the sequence's blocks; the full ones among its first `cache_tokens` become
        cached first, so a recompute after preemption finds them if nobody evicts them meanwhile."""
        kv = self.kv
        if cache_tokens:
            for i in range(cache_tokens // self._bs):
                if i not in seq.held and seq.private > 0:
                    key = seq.block_key(i)
                    if kv.promote(key):
                        seq.held[i] = key
                        seq.private -= 1
        kv.release(seq.private, [seq.held[i] for i in sorted(seq.held, reverse=True)])
        seq.private = 0
        seq.held = {}

    def _start_decoding(self, seq: _Seq) -> None:
        s = self._step_no
        seq.state = _DECODE
        seq.base_step = s
        seq.finish_step = s + seq.target - seq.out - 1
        self._decoding[seq.id] = seq
        self._ctx_sum += seq.prompt + seq.out
        heapq.heappush(self._finish_heap, (seq.finish_step, seq.run_order, seq.epoch, seq))
        # The first step at which the context (prompt + output) fills its last block exactly.
        first = s + (-(seq.prompt + seq.out - 1)) % self._bs
        if first <= seq.finish_step:
            heapq.heappush(self._alloc_heap, (first, seq.run_order, seq.epoch, seq))

    def _finish(self, seq: _Seq, events: list[Event]) -> None:
        out = self._out_now(seq)
        self._leave_running(seq)
        self._free(seq, 0)
        seq.state = _GONE
        del self._seqs[seq.id]
        self.finished_total[seq.length_reason] += 1
        events.append(RequestFinished(seq.id, seq.prompt, out, seq.length_reason, seq.preemptions))

    def audit(self) -> list[str]:
        """Cross-check the incremental bookkeeping against a recount (tests and debugging; O(n))."""
        problems: list[str] = []
        bs = self._bs
        held_blocks = 0
        for seq in self._running.values():
            if seq.state == _DECODE:
                tokens = seq.prompt + self._out_now(seq) - 1  # KV written before the next step
            else:
                tokens = seq.computed
            have = seq.private + len(seq.held)
            if have < -(-tokens // bs):
                problems.append(f"{seq.id} holds {have} blocks for {tokens} tokens")
            held_blocks += seq.private
        if len(self._running) > self.config.max_num_seqs:
            problems.append(f"{len(self._running)} running > max_num_seqs {self.config.max_num_seqs}")
        if self.kv.used_blocks != held_blocks + self.kv.referenced_cached_blocks():
            problems.append(f"KV used {self.kv.used_blocks} != blocks held by running sequences")
        if self.kv.used_blocks > self.kv.num_blocks or self.kv.free_blocks < 0:
            problems.append("KV over capacity")
        ctx = sum(q.prompt + self._out_now(q) for q in self._decoding.values())
        if ctx != self._ctx_sum:
            problems.append(f"context sum {self._ctx_sum} != recount {ctx}")
        if self._n_waiting != sum(1 for q in self._seqs.values() if q.state == _WAITING):
            problems.append("waiting count out of step")
        if set(self._running) != set(self._prefilling) | set(self._decoding):
            problems.append("running set != prefilling + decoding")
        return problems
