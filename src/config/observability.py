"""How the gateway is watched: `[ops]` (the listener of metrics, health and the status page)
and `[telemetry]` (OTLP traces)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from config.section import Section


class OpsConfig(Section):
    """The operations listener: metrics, health and the status page, off the public port."""

    listen: str = "127.0.0.1:9464"  # port 0: any free port (printed at start)


class TelemetryConfig(Section):
    otlp_endpoint: str | None = None
    service_name: str = "gateway"
    sample_ratio: Annotated[float, Meta(ge=0, le=1)] = 1.0
