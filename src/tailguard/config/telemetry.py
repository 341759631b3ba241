"""The gateway's config section for OpenTelemetry traces (`telemetry:`); off unless an OTLP
endpoint is named here or in the standard `OTEL_EXPORTER_OTLP_*` variables."""

from __future__ import annotations

from pydantic import Field, field_validator

from tailguard.config.base import _Model, require_extra


class TelemetryConfig(_Model):
    """Where request traces go (needs the `otel` extra: `pip install 'tailguard[full,otel]'`)."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP traces URL, e.g. `http://collector:4318/v1/traces`. Unset: "
        "`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`, else no traces.",
    )
    service_name: str = Field(default="tailguard", description="The traces' `service.name` resource attribute.")

    @field_validator("otlp_endpoint")
    @classmethod
    def _otel_installed(cls, v: str | None) -> str | None:
        if v is not None:
            require_extra("otel")
        return v
