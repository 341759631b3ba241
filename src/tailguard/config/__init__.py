"""The gateway's configuration: pydantic models for `tailguard.yaml` and `load_config(path)`.

Every field has a default and a description (docs/configuration.md is written from them), and
unknown keys are errors, so a typo in a config file fails loudly instead of being ignored.

The models are split by section, one module each: base.py (the shared base model and the front's
defaults), classes.py, backends.py, scheduler.py, upstream.py (timeouts, health probes, retries), fleet.py
(routing, ejection),
auth.py, limits.py (bounds on what backends and clients may cost), telemetry.py (traces), state.py (limits shared
by replicas through Redis), guards.py (content guards and redaction), audit.py (the audit trail), programs.py (agent programs), gateway.py (`GatewayConfig`, the whole file), problems.py (validation errors as text) and
loading.py (`load_config`). Every public name is importable from here.
"""

from tailguard.front.params import CapMode, ServiceTier
from tailguard.config.audit import AuditConfig
from tailguard.config.auth import ApiKeyConfig, AuthConfig
from tailguard.config.batches import BatchesConfig
from tailguard.config.backends import AdaptiveConfig, BackendConfig, BackendKind
from tailguard.config.classes import ClassConfig, SloConfig, default_classes
from tailguard.config.fleet import EjectionConfig, HedgingConfig, RoutingConfig
from tailguard.config.gateway import GatewayConfig
from tailguard.config.guards import GuardConfig, NationalIdConfig, RedactionConfig
from tailguard.config.limits import LimitsConfig
from tailguard.config.loading import load_config
from tailguard.config.programs import ProgramsConfig
from tailguard.config.scheduler import OutputEstimateConfig, SchedulerConfig, SchedulerPolicy
from tailguard.config.state import StateConfig
from tailguard.config.telemetry import TelemetryConfig
from tailguard.config.upstream import HealthConfig, RetryConfig, TimeoutsConfig

__all__ = [
    "AdaptiveConfig", "ApiKeyConfig", "AuditConfig", "AuthConfig", "BackendConfig", "BackendKind", "BatchesConfig", "CapMode", "ClassConfig",
    "EjectionConfig", "GatewayConfig", "GuardConfig", "HedgingConfig", "HealthConfig", "LimitsConfig", "NationalIdConfig", "OutputEstimateConfig",
    "ProgramsConfig", "RedactionConfig", "RetryConfig", "RoutingConfig", "SchedulerConfig",
    "SchedulerPolicy", "ServiceTier", "SloConfig", "StateConfig", "TelemetryConfig", "TimeoutsConfig", "default_classes", "load_config",
]
