"""The asyncio driver of the front: handlers wait in `admit` for their slot, the front's decisions
land on each request's record (backend, counts, bind instant) and line, refusals become the
client's errors, one timer delivers queue deadlines, the request's one end is its `Finished`, and
probes read health as `HealthChanged` left it. Driven on a virtual-time loop
(tests/unit/gateway/virtual_loop.py) whose clock the dispatcher is given: no socket, no sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tailguard.errors import Overloaded, RateLimited
from tailguard.front.events import Failed, GiveUp, GiveUpReason, Opened, Probed, Start, StartMode
from tailguard.front.params import BackendSpec, CallerSpec, ClassSpec, FrontParams, PreemptionParams
from tailguard.gateway.dispatch import Dispatcher
from tailguard.gateway.line import Line
from tailguard.gateway.ops.metrics import GatewayMetrics
from tailguard.gateway.request import Ended, Request
from tailguard.gateway.upstream.resume import Transcript
from tailguard.types import FailureKind, Outcome
from tests.unit.gateway.virtual_loop import VirtualClock, run

CLASSES = [ClassSpec(name="interactive", rank=0, max_queue_wait_s=5.0),
           ClassSpec(name="batch", rank=1, max_queue_wait_s=600.0, preemptible=True)]


@pytest.fixture
def clock() -> Iterator[VirtualClock]:
    yield VirtualClock()


def make(loop: asyncio.AbstractEventLoop, clock: VirtualClock, *backends: BackendSpec,
         callers: list[CallerSpec] | None = None) -> Dispatcher:
    params = FrontParams(classes=CLASSES, backends=list(backends) or [BackendSpec("a", max_concurrency=1, continues=True)],
                         preemption=PreemptionParams(enabled=True), callers=callers or [])
    return Dispatcher(params, GatewayMetrics(), loop, clock)


def rec(d: Dispatcher, req_id: str, cls: str = "interactive", at: float = 1000.0, caller: str | None = None) -> Line:
    return d.line(Request(req_id, at, cls=cls, caller=caller))


def end(d: Dispatcher, line: Line, outcome: Outcome) -> None:
    """The request's one end, as the lifecycle hands it over."""
    line.request.end(outcome, 200, None)
    d.ended(Ended(line.request, "POST", "/v1/chat/completions"))


def test_an_idle_gateway_binds_at_once_and_the_record_says_where(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock)
        line = rec(d, "r1")
        await d.admit(line, 100)
        r = line.request
        assert (r.backend, r.counts.attempts, r.bound_at, r.queue_s) == ("a", 1, 1000.0, 0.0)
        end(d, line, Outcome.SUCCESS)
        end(d, line, Outcome.SUCCESS)  # a second end is a no-op: a request ends once
        assert len(d) == 0 and d.front.backend("a").in_flight == 0

    run(clock, main)


def test_a_queued_request_starts_when_the_slot_is_released_and_its_wait_is_on_its_record(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock)
        first, second = rec(d, "r1"), rec(d, "r2")
        await d.admit(first, 100)
        waiting = asyncio.ensure_future(d.admit(second, 100))
        await asyncio.sleep(2.0)  # virtual seconds
        assert not waiting.done() and len(d) == 1
        end(d, first, Outcome.SUCCESS)
        await asyncio.wait_for(waiting, 1.0)
        assert second.request.backend == "a" and second.request.queue_s == pytest.approx(2.0)

    run(clock, main)


def test_a_client_that_leaves_while_queued_is_finished_once_and_frees_its_place(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock)
        first, second = rec(d, "r1"), rec(d, "r2")
        await d.admit(first, 100)
        waiting = asyncio.ensure_future(d.admit(second, 100))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert len(d) == 1  # still queued: its one end tells the front it left
        end(d, second, Outcome.CLIENT_GONE)
        end(d, second, Outcome.CLIENT_GONE)  # nothing twice
        assert second.ended and len(d) == 0
        end(d, first, Outcome.SUCCESS)
        assert d.front.backend("a").in_flight == 0

    run(clock, main)


def test_the_timer_expires_a_queued_request_at_its_class_bound(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock)
        await d.admit(rec(d, "r1"), 100)
        late = rec(d, "r2")
        with pytest.raises(Overloaded) as err:
            await d.admit(late, 100)
        assert err.value.code == "queue_timeout" and err.value.headers["X-Tailguard-Reject-Reason"] == "queue_timeout"
        assert clock.now == pytest.approx(1005.0)  # interactive waits at most 5 s
        assert "waited 5.000 s" in err.value.message and late.ended

    run(clock, main)


def test_a_caller_over_its_limit_gets_openai_s_429_and_its_rate_headers(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock, BackendSpec("a", max_concurrency=4), callers=[CallerSpec("team", requests_per_minute=1)])
        await d.admit(rec(d, "r1", caller="team"), 100)
        with pytest.raises(RateLimited) as err:
            await d.admit(rec(d, "r2", caller="team"), 100)
        assert (err.value.status, err.value.type, err.value.code) == (429, "requests", "rate_limit_exceeded")
        assert err.value.message == ("Rate limit reached for caller 'team' on requests per min (RPM): Limit 1, Used 1. "
                                     "Please try again in 1m0s.")
        headers = d.rate_headers("team")
        assert headers is not None and headers["x-ratelimit-remaining-requests"] == "0"

    run(clock, main)


def test_a_suspension_lands_on_the_record_and_the_request_resumes_on_a_new_start(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock)
        job, chat = rec(d, "b1", "batch"), rec(d, "c1")
        transcript = job.transcript = Transcript()
        await d.admit(job, 1000, max_tokens=900)
        stopped: list[str] = []
        job.attempting(lambda: stopped.append("closed"))
        job.tell(Opened("b1"))
        transcript.add("so far")  # a token: the front is told it as Generated before the next event
        await d.admit(chat, 50)  # the chat takes the batch job's slot at once
        assert stopped == ["closed"] and job.request.counts.preemptions == 1 and transcript.suspended
        assert (chat.request.backend, job.request.counts.attempts) == ("a", 1)
        resumed = asyncio.ensure_future(job.next())
        await asyncio.sleep(0)
        assert not resumed.done()
        end(d, chat, Outcome.SUCCESS)
        start = await asyncio.wait_for(resumed, 1.0)
        assert start.mode is StartMode.CONTINUE
        r = job.request
        assert (r.backend, r.counts.attempts, r.counts.preemptions) == ("a", 1, 1)  # a continuation: no attempt

    run(clock, main)


def test_a_failed_attempt_the_front_retries_is_a_new_attempt_elsewhere(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock, BackendSpec("a", max_concurrency=1), BackendSpec("b", max_concurrency=1))
        line = rec(d, "r1")
        await d.admit(line, 100)
        r = line.request
        first = r.backend
        [retry] = line.tell(Failed("r1", FailureKind.CONNECT, delivered=False, answered=False))
        assert isinstance(retry, Start) and retry.mode is StartMode.RETRY
        assert r.backend != first and (r.counts.attempts, r.counts.retries) == (2, 1)
        [gave_up] = line.tell(Failed("r1", FailureKind.TIMEOUT_IDLE, delivered=True, answered=True))  # after bytes
        assert isinstance(gave_up, GiveUp) and gave_up.reason is GiveUpReason.NOT_CONTINUABLE
        end(d, line, Outcome.TIMEOUT)

    run(clock, main)


def test_probes_follow_the_health_the_front_decided(clock: VirtualClock) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        d = make(loop, clock)
        assert d.healthy == {"a": True}
        for _ in range(3):  # unhealthy_after: 3
            d.tell(Probed("a", False))
        assert d.healthy == {"a": False}
        with pytest.raises(Overloaded) as err:
            await d.admit(rec(d, "r1"), 100)
        assert err.value.code == "no_healthy_backend"
        d.tell(Probed("a", True))
        assert d.healthy == {"a": True}

    run(clock, main)
