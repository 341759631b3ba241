"""Whether one request met its service-level objective (`front.params.Slo`): the one rule every
record of a request is judged by (the gateway's access log and `tailguard_slo_total`, the DES's
timelines in the benchmarks); pure, no I/O.

Each target the objective has is met or missed:
- `ttft`: the first content came within `ttft_s` of arrival. A request that ended without one
  missed it (refused, failed, timed out), unless its client left before the target passed;
- `tpot`: (E2E - TTFT) / (output tokens - 1) within `tpot_s`, for a request that ended well with two
  tokens or more (one that failed missed it);
- `e2e`: ended well within `e2e_s` of arrival.
A request the client got wrong (`client_error`: refused with a 4xx before any service) is not judged.
DistServe's goodput counts a request as served in time only when it meets every target; `met_all`.
"""

from __future__ import annotations

from tailguard.front.params import Slo
from tailguard.types import Outcome

TARGETS = ("ttft", "tpot", "e2e")


def judge(slo: Slo, outcome: Outcome, e2e_s: float, ttft_s: float | None, output_tokens: int) -> dict[str, bool]:
    """For each target of `slo` that applies to this request, whether it was met (see the module
    docstring). `e2e_s`: arrival to its end; `ttft_s`: arrival to its first content (None: none came)."""
    if outcome is Outcome.CLIENT_ERROR:
        return {}
    ok = outcome is Outcome.SUCCESS
    out: dict[str, bool] = {}
    if slo.ttft_s is not None:
        if ttft_s is not None:
            out["ttft"] = ttft_s <= slo.ttft_s
        elif not (outcome is Outcome.CLIENT_GONE and e2e_s < slo.ttft_s):
            out["ttft"] = False
    if slo.tpot_s is not None:
        if ok and ttft_s is not None and output_tokens > 1:
            out["tpot"] = (e2e_s - ttft_s) / (output_tokens - 1) <= slo.tpot_s
        elif not ok and outcome is not Outcome.CLIENT_GONE:
            out["tpot"] = False
    if slo.e2e_s is not None and outcome is not Outcome.CLIENT_GONE:
        out["e2e"] = ok and e2e_s <= slo.e2e_s
    return out


def met_all(verdict: dict[str, bool]) -> bool:
    """Every target judged was met (goodput's test)."""
    return all(verdict.values())
