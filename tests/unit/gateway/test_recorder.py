"""The gateway's recorder: a preemptible request's many `Generated` events written as the latest
count before the next other event, with which the replay still decides the same (the victim
depends on the counts); a request's record written as it is (one clock); nothing after `close`."""

from __future__ import annotations

import io
from collections.abc import Sequence

from tailguard.front.counts import Counts
from tailguard.front.events import Arrive, Decision, Event, Finished, Generated, Opened, Start, Suspend
from tailguard.front.front import Front
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams
from tailguard.recording.codec import Header, Observation, read
from tailguard.recording.replay import conform
from tailguard.gateway.ops.recorder import Recorder
from tailguard.gateway.request import Request
from tailguard.types import Outcome

PARAMS = FrontParams(classes=[ClassSpec("interactive", rank=0), ClassSpec("batch", rank=1, preemptible=True)],
                     backends=[BackendSpec("a", max_concurrency=2, continues=True)])


class Drive:
    """What the dispatcher does with each event: hand it to the front, record it with its decisions."""

    def __init__(self) -> None:
        self.front = Front(PARAMS)
        self.out = io.StringIO()
        self.out.close = lambda: None  # type: ignore[method-assign]  # read after the recorder closes it
        self.recorder = Recorder(self.out, Header(PARAMS))

    def __call__(self, event: Event, now: float) -> Sequence[Decision]:
        decisions = self.front.handle(event, now)
        self.recorder.event(event, now, True, decisions)
        return decisions

    def lines(self) -> list[str]:
        return self.out.getvalue().splitlines()


def test_only_the_latest_count_goes_out_and_the_replay_picks_the_same_victim() -> None:
    d = Drive()
    for i, now in (("b1", 0.0), ("b2", 0.0)):
        assert d(Arrive(i, "batch", 1100, resumable=True, max_tokens=1000), now) == [Start(i, "a")]
        d(Opened(i), now)
    for n in range(1, 91):  # b1 runs ahead: 900 of its 1000 tokens, so 100 left
        d(Generated("b1", 10 * n), n / 100)
    d(Generated("b2", 500), 0.95)  # 500 left: the one a chat should suspend
    assert d(Arrive("c1", "interactive", 50), 1.0) == [Suspend("b2", "a"), Start("c1", "a")]
    lines = d.lines()
    generated = [line for line in lines if '"Generated"' in line]
    assert len(generated) == 2 and '"tokens":900' in generated[0] and '"tokens":500' in generated[1]
    assert lines.index(generated[1]) == lines.index(next(line for line in lines if '"id":"c1"' in line)) - 1
    assert '"now":0.9' in generated[0]  # each keeps its own instant
    rec = read(lines)
    assert conform(rec).identical


def test_counts_still_pending_are_written_at_close_and_nothing_after() -> None:
    d = Drive()
    d(Arrive("b1", "batch", 1100, resumable=True, max_tokens=1000), 0.0)
    d(Generated("b1", 3), 0.5)
    d.recorder.close()
    d.recorder.event(Finished("b1", Outcome.SUCCESS), 1.0, True, ())
    d.recorder.close()  # twice is harmless
    rec = read(d.lines())
    assert [type(s.event) for s in rec.steps] == [Arrive, Generated]


def test_a_request_is_written_from_its_record() -> None:
    d = Drive()
    t = Request("r1", 1.0, cls="batch", caller="alice", bound_at=1.25, first_content_at=1.5, finished_at=3.0,
                prompt_tokens=40, output_tokens=7, counts=Counts(attempts=2, retries=1, preemptions=1),
                outcome=Outcome.SUCCESS)
    d.recorder.request(t)
    d.recorder.request(Request("r2", 2.0, outcome=Outcome.CLIENT_ERROR))
    assert read(d.lines()).requests == (
        Observation("r1", "batch", Outcome.SUCCESS, 40, 7, 1.0, 3.0, 1.25, 1.5, None, "alice", 2, 1, retries=1),
        Observation("r2", "none", Outcome.CLIENT_ERROR, 0, 0, 2.0, 2.0),
    )
