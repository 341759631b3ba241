"""Every driver of the front carries out every decision, or says why one cannot reach it: each
declares a table of the decision types it carries out (the method it runs for each) and of those
that do not apply to it, with the reason, and dispatches through that table alone. A decision type
added to the front without a line in every driver's table fails here, before a driver drops it
silently (the DES once ignored `Wait`, `HealthChanged`, `Ejected`, `Readmitted` and `Retired`
without saying so)."""

from __future__ import annotations

import typing
from types import ModuleType

import pytest

import tailguard.gateway.dispatch as gateway
import tailguard.sim.carrier as carrier
import tailguard.sim.replicas as replicas
import tailguard.sweep.traffic as traffic
from tailguard.front.events import Decision
from tailguard.gateway.dispatch import Dispatcher
from tailguard.recording import legacy
from tailguard.sim.carrier import Carrier
from tailguard.sim.replicas import _Run
from tailguard.sweep.traffic import _Reader

DECISIONS = set(typing.get_args(Decision))
# driver -> (its module, the class whose methods its table names, the decision types it may meet)
DRIVERS: dict[str, tuple[ModuleType, type, set[type]]] = {
    "gateway": (gateway, Dispatcher, DECISIONS),
    "des": (carrier, Carrier, DECISIONS),
    "replicas": (replicas, _Run, DECISIONS),
    # a recording's reader meets a version-1 recording's decisions too
    "sweep traffic": (traffic, _Reader, DECISIONS | set(legacy.RENAMED.values())),
}


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_each_decision_is_carried_out_or_named_as_not_applicable_with_a_reason(name: str) -> None:
    module, cls, meets = DRIVERS[name]
    carried: dict[type, str] = module.CARRIED
    not_applicable: dict[type, str] = module.NOT_APPLICABLE
    assert not set(carried) & set(not_applicable), f"{name}: both carried and not applicable"
    missing = meets - set(carried) - set(not_applicable)
    assert not missing, f"{name} neither carries out nor names as not applicable: {sorted(t.__name__ for t in missing)}"
    assert set(carried) | set(not_applicable) <= meets, f"{name} names decisions that do not exist"
    for kind, method in carried.items():
        assert callable(getattr(cls, method, None)), f"{name}: {kind.__name__} -> {method}, which {cls.__name__} lacks"
    for kind, why in not_applicable.items():
        assert len(why.split()) >= 4, f"{name}: {kind.__name__} is not applicable without a reason"
