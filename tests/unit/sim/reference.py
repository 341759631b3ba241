"""A deliberately naive engine with the semantics documented in tailguard.sim.engine: every
sequence is updated on every step and nothing is derived lazily. The real engine must produce the
same steps; this is what catches a bookkeeping slip in its heaps and running sums."""

from __future__ import annotations

from dataclasses import dataclass, field

from tailguard.sim.cost import EngineConfig
from tailguard.sim.engine import Admitted, Event, FirstToken, Preempted, RequestFinished, SimRequest, Step


@dataclass
class RefSeq:
    id: str
    prompt: int
    target: int
    priority: int
    arrived_at: float
    seqno: int
    out: int = 0
    computed: int = 0
    blocks: int = 0
    state: str = "waiting"
    run_order: int = 0
    admitted: bool = False
    preemptions: int = 0


@dataclass
class RefEngine:
    config: EngineConfig
    free: int = 0
    waiting: list[RefSeq] = field(default_factory=list)
    running: list[RefSeq] = field(default_factory=list)
    seqno: int = 0
    run_order: int = 0

    def __post_init__(self) -> None:
        self.free = self.config.num_kv_blocks

    def _ceil(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def add(self, req: SimRequest, now: float) -> None:
        target = min(req.max_tokens, self.config.max_model_len - req.prompt_tokens)
        self.waiting.append(RefSeq(req.id, req.prompt_tokens, target, req.priority, now, self.seqno))
        self.seqno += 1

    def abort(self, req_id: str, now: float) -> None:
        for q in self.waiting:
            if q.id == req_id:
                self.waiting.remove(q)
                return
        for q in self.running:
            if q.id == req_id:
                self.running.remove(q)
                self.free += q.blocks
                return

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def _head(self) -> RefSeq:
        if self.config.scheduling_policy == "priority":
            return min(self.waiting, key=lambda q: (q.priority, q.arrived_at, q.seqno))
        return self.waiting[0]

    def _victim(self) -> RefSeq:
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=lambda q: (q.priority, q.arrived_at, q.seqno))
        return max(self.running, key=lambda q: q.run_order)

    def _make_room(self, need: int, seq: RefSeq, events: list[Event], chunks: dict[str, tuple[RefSeq, int, int]]) -> bool:
        while self.free < need:
            v = self._victim()
            chunks.pop(v.id, None)
            self.running.remove(v)
            self.free += v.blocks
            v.blocks = 0
            v.computed = 0
            v.state = "waiting"
            v.preemptions += 1
            self.waiting.insert(0, v)
            events.append(Preempted(v.id, v.out))
            if v is seq:
                return False
        self.free -= need
        return True

    def step(self, now: float) -> Step:
        cfg = self.config
        events: list[Event] = []
        chunks: dict[str, tuple[RefSeq, int, int]] = {}
        for q in [q for q in self.running if q.state == "decode"]:
            if q.state != "decode":
                continue
            need = self._ceil(q.prompt + q.out) - q.blocks
            if need > 0 and self._make_room(need, q, events, chunks):
                q.blocks += need
        preempted = bool(events)
        budget = cfg.max_num_batched_tokens - sum(1 for q in self.running if q.state == "decode")
        for q in [q for q in self.running if q.state == "prefill"]:
            if budget <= 0:
                break
            if q.state != "prefill":
                continue
            chunk = min(q.prompt + q.out - q.computed, budget)
            need = self._ceil(q.computed + chunk) - q.blocks
            n = len(events)
            ok = self._make_room(need, q, events, chunks)
            if len(events) != n:
                preempted = True
                budget = (cfg.max_num_batched_tokens - sum(1 for r in self.running if r.state == "decode")
                          - sum(c for _, c, _ in chunks.values()))
            if ok:
                q.blocks += need
                chunks[q.id] = (q, chunk, q.computed)
                budget -= chunk
        decoding = [q for q in self.running if q.state == "decode"]
        if self.waiting and (not preempted or (not decoding and not chunks)):
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                q = self._head()
                chunk = min(q.prompt + q.out, budget)
                need = self._ceil(chunk)
                if self.free < need:
                    break
                self.waiting.remove(q)
                self.free -= need
                q.blocks = need
                q.state = "prefill"
                q.run_order = self.run_order
                self.run_order += 1
                self.running.append(q)
                events.append(Admitted(q.id, max(0.0, now - q.arrived_at), 0, q.admitted))
                q.admitted = True
                chunks[q.id] = (q, chunk, 0)
                budget -= chunk
        if not decoding and not chunks:
            return Step(now, 0.0, (), tuple(events), 0, 0, 0)
        prefill = sum(c for _, c, _ in chunks.values())
        kv_read = sum(q.prompt + q.out for q in decoding) + sum(b for _, _, b in chunks.values())
        duration = cfg.cost.step_time(prefill, len(decoding), kv_read)
        emitted = [q.id for q in decoding]
        for q in decoding:
            q.out += 1
        done = []
        for q, chunk, before in chunks.values():
            q.computed = before + chunk
            if q.computed == q.prompt + q.out:
                emitted.append(q.id)
                q.out += 1
                if q.out == 1:
                    events.append(FirstToken(q.id))
                done.append(q)
        for q in sorted((q for q in decoding if q.out >= q.target), key=lambda q: q.run_order):
            self._finish(q, events)
        for q in done:
            if q.out >= q.target:
                self._finish(q, events)
            else:
                q.state = "decode"
        return Step(now, duration, tuple(emitted), tuple(events), prefill, len(decoding), kv_read)

    def _finish(self, q: RefSeq, events: list[Event]) -> None:
        self.running.remove(q)
        self.free += q.blocks
        events.append(RequestFinished(q.id, q.prompt, q.out, "length", q.preemptions))
