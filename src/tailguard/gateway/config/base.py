"""What every section of the gateway's config shares, in a module of its own so that each
section imports it and none imports another: the base model (unknown keys are errors, a
validated config never changes) and the front's defaults the sections start from."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tailguard.front import params as fp
from tailguard.front.adaptive import AdaptiveParams

# The front's defaults (tailguard.front.params), so each default number lives in one place.
_CLS = fp.ClassSpec(name="")
_INTAKE = fp.IntakeParams(classes=())
_OUTPUT = fp.OutputEstimateParams()
_QUEUE = fp.QueueParams()
_PREEMPT = fp.PreemptionParams()
_BACKEND = fp.BackendSpec(name="")
_ADAPTIVE = AdaptiveParams()
_HEALTH = fp.HealthParams()
_RETRY = fp.RetryParams()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
