"""The engine's step-time model fitted to requests as a gateway saw them served; pure, no I/O.

A recording (`tailguard serve --record`) holds, per request, its prompt and output sizes, when
it was bound to a slot, when its first content came and when it finished, and who else ran on
its backend meanwhile. From those, two rates the engine showed are read, on the recording's own
clock (a simulator at `--time-scale 0.25` shows a quarter of its preset's times):

- decode: each request's time per output token after the first (TPOT), less the prefills that
  shared its steps, against the step time the cost model gives for the sequences running beside
  it and the context they read (`a + c * seqs + d * kv_tokens`); the median ratio scales `a`, `c`
  and `d` together;
- prefill: its time from bind to first content, less the step it waited for and the base cost of
  the step that prefilled it, against its prompt size: the least-squares slope is `b` and the
  rest a fixed cost per request (`Fit.overhead_s`). Only prompts of varied sizes tell the two
  apart; when they are alike, `b` takes the decode scale (the same machine, equally faster or
  slower than the preset) and the rest is overhead.

So the model keeps its shape (how a step grows with the batch and the context, from the preset)
and takes its level from the run. Rates are what one recorded run can tell apart: with the batch
size near constant, `a`, `c` and `d` cannot be separated from each other.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tailguard.sim.cost import CostModel


@dataclass(frozen=True, slots=True)
class Served:
    """One request as it was served. `running`/`context_tokens`: the sequences on its backend
    (itself included) and the KV tokens they held, time-averaged over its decode; `others_at_bind`/
    `others_context_tokens`: the same for the others, over its prefill (bind to first content)."""

    prompt_tokens: int
    output_tokens: int
    prefill_s: float | None  # bind to first content
    tpot_s: float | None  # (finish - first content) / (output - 1)
    running: float = 1.0
    context_tokens: float = 0.0
    others_at_bind: float = 0.0
    others_context_tokens: float = 0.0
    # Prompt tokens the others bound to its backend while it decoded (their prefills and
    # continuations), per token it generated after the first: steps it shared with a prefill.
    prefill_beside: float = 0.0


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted model, how far it is from the shape it started from, and what it rests on.
    `overhead_s` is the part of the time to first content no engine step explains (the hops
    between gateway and engine, the engine's own intake): the simulator adds it to each TTFT."""

    cost: CostModel
    decode_scale: float  # fitted a, c, d over the shape's
    prefill_scale: float  # fitted b over the shape's
    overhead_s: float
    decode_samples: int
    prefill_samples: int
    prefill_from_prompts: bool  # b read from the prompts' spread (else: the decode scale)


# Prompts must span this factor (90th over 10th percentile) for their times to tell b apart
# from a fixed cost per request; else b takes the decode scale (the same machine, as fast).
MIN_PROMPT_SPREAD = 4.0
ROUNDS = 5  # of decode level, then b: each round moves the other by a fraction of what prefills share


def fit(shape: CostModel, served: list[Served]) -> Fit:
    """`shape` scaled to what `served` shows (see the module docstring). With no decode sample,
    the shape's own level.

    A decode shares steps with the prefills of requests that start beside it, so its time per
    token holds some of `b`, and `b` is read from prefills once the decode level is known: the
    two are found in turn, from the decode level alone, until they settle (a few rounds)."""
    decodes = [s for s in served if s.tpot_s is not None and s.tpot_s > 0]
    prefills = [s for s in served if s.prefill_s is not None and s.prompt_tokens >= 1]
    scale, b, from_prompts, overhead = 1.0, shape.b_s_per_prefill_token, False, 0.0
    for _ in range(ROUNDS):
        if decodes:
            scale = statistics.median((s.tpot_s - b * s.prefill_beside) / shape.step_time(0, s.running, s.context_tokens)
                                      for s in decodes if s.tpot_s is not None)
        b, from_prompts, overhead = _prefill(shape, scale, prefills)
    cost = CostModel(shape.a_s * scale, b, shape.c_s_per_decode_seq * scale, shape.d_s_per_kv_token * scale)
    prefill_scale = b / shape.b_s_per_prefill_token if shape.b_s_per_prefill_token else 1.0
    return Fit(cost, scale, prefill_scale, overhead, len(decodes), len(prefills), from_prompts)


def _prefill(shape: CostModel, scale: float, prefills: list[Served]) -> tuple[float, bool, float]:
    """`b`, whether the prompts' spread gave it, and the fixed cost per request, at decode level
    `scale`: what is left of each prefill once the step it waited for and the base cost of the
    step that prefilled it are taken out is b per prompt token plus that fixed cost."""
    prompts, rest = [], []
    for s in prefills:
        assert s.prefill_s is not None
        base = scale * shape.step_time(0, s.others_at_bind, s.others_context_tokens)
        # A busy engine finishes the step under way first: half of one, on average.
        waited = 0.5 * base if s.others_at_bind >= 0.5 else 0.0
        prompts.append(float(s.prompt_tokens))
        rest.append(s.prefill_s - waited - base)
    b, from_prompts = scale * shape.b_s_per_prefill_token, False
    if len(prompts) >= 2:
        qs = statistics.quantiles(prompts, n=10)
        slope = _slope(prompts, rest)
        if qs[-1] >= MIN_PROMPT_SPREAD * qs[0] and slope > 0:
            b, from_prompts = slope, True
    overhead = max(0.0, statistics.median(r - b * p for p, r in zip(prompts, rest))) if prompts else 0.0
    return b, from_prompts, overhead


def _slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of y on x (0 when x does not vary)."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx if sxx else 0.0
