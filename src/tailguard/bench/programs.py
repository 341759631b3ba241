"""An agent workload over HTTP (`bench.agents`): each program's calls sent as an agent sends
them, each prompt the conversation so far (the system prompt, the task, every earlier answer as
the assistant's message and every tool result after it), the next step only once every answer of
this one is in and its tools have run.

Programs start open loop, each at its due time (Poisson at `--rate` programs a wall second, as
`--rate` is for requests; `--requests` counts programs); a call is due when its program sends it,
which is when its latency is measured from. A tool's time is in the run's clock: against a
simulator at `--time-scale 0.25`, a 1 s tool gap waits 0.25 wall seconds. Every call is a request record of its program's class with the program's index, its number
in it and whether it was to be the last (`RequestRecord.program*`), so a program's end-to-end
time is read from `requests.jsonl` alone (`bench.program_stats`). A program whose call fails stops
there: it counts as failed, as an agent whose model call failed would.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import orjson

from tailguard.bench.agents import AgentWorkload, ProgramClass, ProgramPlan, plan_programs
from tailguard.bench.loop import Loop
from tailguard.bench.recorder import RequestRecord
from tailguard.bench.stream import PlannedRequest, TextPool, request_fields
from tailguard.bench.workload import ENDPOINT_PATHS
from tailguard.errors import ConfigError
from tailguard.wire.headers import PROGRAM_HEADER
from tailguard.wire.tokens import CHAT_MESSAGE_OVERHEAD_TOKENS, synthetic_text, text_tokens


class ProgramRun(Loop):
    """A bench run whose open loop starts programs instead of requests (see the module docstring)."""

    def __init__(self, agents: AgentWorkload, *args: Any) -> None:
        super().__init__(*args)  # its time_scale: a tool's time is in the run's clock (simulated seconds)
        c = self.config
        if c.rate is None or c.concurrency is not None:
            raise ConfigError("an agent workload runs open loop: give --rate (programs a second), not --concurrency")
        if c.workers > 1:
            raise ConfigError("an agent workload runs in one process: --workers 1")
        self.agents = agents
        self._classes = {p.name: p for p in agents.programs}
        self._pool = TextPool(random.Random(f"{c.seed}:program-text"))
        self._systems = {p.name: synthetic_text(p.system_prompt.tokens, random.Random(f"{c.seed}:system:{p.name}"))
                         for p in agents.programs if p.system_prompt is not None and p.system_prompt.shared}
        self._calls = 0  # request records made so far: each call's index

    async def _closed_loop(self) -> None:  # never: __init__ refuses --concurrency
        raise ConfigError("an agent workload runs open loop")

    async def _send_open(self) -> None:
        rate = self.config.rate
        assert rate is not None
        tasks = self._tasks
        for plan in plan_programs(self.agents, rate, self.config.seed):
            if not self._more(plan.start_s):
                break
            self._issued += 1
            due_at = self.t0 + plan.start_s
            while (delay := due_at - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            warmup = plan.index < self.config.warmup_requests or plan.start_s < self.config.warmup_s
            task = asyncio.create_task(self._program(plan, warmup))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _program(self, plan: ProgramPlan, warmup: bool) -> None:
        """One program to its end, or to its first failed call."""
        c = self._classes[plan.cls]
        system = self._systems.get(c.name) if c.system_prompt is not None else None
        if c.system_prompt is not None and system is None:
            system = self._pool.take(c.system_prompt.tokens)
        messages: list[dict[str, str]] = ([{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": self._pool.take(plan.task_tokens)})
        due_s = plan.start_s
        call = 0
        for i, step in enumerate(plan.steps):
            if i:
                await asyncio.sleep(max(0.0, self.t0 + due_s + step.gap_s * self.time_scale - time.perf_counter()))
                due_s = time.perf_counter() - self.t0
                messages.append({"role": "user", "content": self._pool.take(step.tool_tokens)})
            answers: list[list[str]] = [[] for _ in step.max_tokens]
            last = i == len(plan.steps) - 1
            sent = []
            for max_tokens, answer in zip(step.max_tokens, answers):
                call += 1
                req = self._request(c, plan, messages, max_tokens)
                sent.append(self._call(req, due_s, warmup, answer, plan.index, call, last))
            records = await asyncio.gather(*sent)
            if not all(r.ok for r in records):
                return
            messages.append({"role": "assistant", "content": "".join(answers[0])})
            due_s = max(r.ended_at for r in records)

    async def _call(self, req: PlannedRequest, due_s: float, warmup: bool, answer: list[str], program: int,
                    call: int, last: bool) -> RequestRecord:
        rec = await self._one(req, due_s, warmup, answer)
        rec.program, rec.program_call, rec.program_last = program, call, last
        return rec

    def _request(self, c: ProgramClass, plan: ProgramPlan, messages: list[dict[str, str]],
                 max_tokens: int) -> PlannedRequest:
        """One call of `plan` with the conversation so far, named as its class names programs."""
        body: dict[str, Any] = {"messages": messages}
        headers = dict(c.headers)
        name = f"{self.config.seed}-{plan.index}"
        if c.named_by == "header":
            headers[PROGRAM_HEADER] = name
        elif c.named_by in ("user", "prompt_cache_key"):
            body[c.named_by] = name
        cls_fields = self.workload.classes[list(self._classes).index(c.name)]
        body.update(request_fields(cls_fields, max_tokens, self.model, "chat"))
        prompt = sum(text_tokens(m["content"]) + CHAT_MESSAGE_OVERHEAD_TOKENS for m in messages)
        index = self._calls
        self._calls += 1
        return PlannedRequest(index, c.name, ENDPOINT_PATHS["chat"], orjson.dumps(body), tuple(headers.items()),
                              prompt, max_tokens, c.stream, "chat")

    def _meta(self, *args: Any) -> dict[str, Any]:
        meta = super()._meta(*args)
        meta["mode"] = "programs"
        meta["agents"] = self.agents.model_dump(mode="json")
        return meta
