"""The what-if on a recording whose truth is known: traffic served by the DES itself on an engine
at half the preset's speed, recorded as the gateway records (every event the front was handed,
and each request's ending). The recording replays identically (the DES is a driver too), the fit
finds the engine's speed, the re-simulation reproduces the recorded tails, and a config with
fewer slots makes the chats wait."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from tailguard.clock import VirtualClock
from tailguard.front.params import BackendSpec, ClassSpec, FrontParams, PreemptionParams
from tailguard.recording.codec import Observation, read, request_line
from tailguard.recording.replay import conform
from tailguard.sim.cost import PRESETS, CostModel
from tailguard.sim.des import run
from tailguard.sim.scenario import Arrival
from tailguard.sim.engine import Engine
from tailguard.sweep.whatif import OTHER, RECORDED, RESIMULATED, one_backend, what_if
from tailguard.types import Outcome
from tests.unit.front.recorded import RecordedFront

SHAPE = PRESETS["h100-llama8b"]
HALF_SPEED = CostModel(*(2.0 * v for v in dataclasses.astuple(SHAPE.cost)))
PARAMS = FrontParams(classes=[ClassSpec("interactive", rank=0), ClassSpec("batch", rank=1, preemptible=True)],
                     backends=[BackendSpec("engine", max_concurrency=8, continues=True)],
                     preemption=PreemptionParams(enabled=True))


def recording() -> list[str]:
    """Chats (varied prompts, short answers) and long batch jobs at about two thirds of the engine's
    capacity, open loop, through the DES with a recording front."""
    rng = random.Random(7)
    t, arrivals = 0.0, []
    for i in range(600):
        t += rng.expovariate(4.0)
        batch = rng.random() < 0.1
        arrivals.append(Arrival(f"r{i}", t, rng.randint(50, 3000), rng.randint(100, 300) if batch else 32,
                                cls="batch" if batch else "interactive"))
    front = RecordedFront(PARAMS)
    engine = dataclasses.replace(SHAPE, cost=HALF_SPEED, max_num_seqs=8)
    for tl in run(Engine(engine), arrivals, VirtualClock(), front):
        assert tl.outcome is Outcome.SUCCESS and tl.finished_at is not None
        front.lines.append(json.dumps(request_line(Observation(
            tl.id, tl.cls, tl.outcome, tl.prompt_tokens, tl.output_tokens, tl.arrived_at, tl.finished_at,
            tl.dispatched_at, tl.first_token_at, "engine", None, 1, tl.suspensions))))
    return front.lines


def test_the_des_recording_replays_identically_and_the_fit_reproduces_it() -> None:
    rec = read(recording())
    assert conform(rec).identical
    fewer = dataclasses.replace(PARAMS, backends=[BackendSpec("engine", max_concurrency=3, continues=True)])
    report = what_if(rec, fewer, SHAPE)
    assert report.requests == 600 and report.fit.decode_scale == pytest.approx(2.0, rel=0.05)
    assert report.fit.prefill_from_prompts and report.fit.prefill_scale == pytest.approx(2.0, rel=0.3)
    chats = report.agreement("interactive")
    assert all(r is not None and 0.8 < r < 1.25 for (m, _), r in chats.items() if m == "ttft_s"), chats
    cols = report.columns
    assert cols[RECORDED]["batch"].preemptions > 0 and cols[RESIMULATED]["batch"].preemptions > 0
    assert cols[OTHER]["interactive"].stats[("queue_s", 99.0)] > 2 * cols[RESIMULATED]["interactive"].stats[("queue_s", 99.0)]
    assert report.engine.max_num_seqs == 8  # the recorded slots, whatever the other config allows


def test_a_class_the_other_config_lacks_is_refused_by_name() -> None:
    rec = read(recording())
    only_chat = dataclasses.replace(PARAMS, classes=[ClassSpec("interactive")])
    with pytest.raises(ValueError, match="class\\(es\\) batch, which the other config does not define"):
        what_if(rec, only_chat, SHAPE)


def test_several_backends_are_one_engine_with_their_slots_summed() -> None:
    two = dataclasses.replace(PARAMS, backends=[BackendSpec("a", 4, continues=True, reserved_slots=1),
                                                BackendSpec("b", 2, continues=False)])
    (merged,) = one_backend(two, {"b": True}).backends  # b was learned to continue
    assert (merged.max_concurrency, merged.continues, merged.reserved_slots) == (6, True, 1)
    (merged,) = one_backend(two, {}).backends
    assert not merged.continues
