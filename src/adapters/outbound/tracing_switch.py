"""Whether tracing is on, decided without importing OpenTelemetry (its SDK and the
protobuf OTLP exporter cost about 10 MB of memory in a process that never traces)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def tracing_wanted(otlp_endpoint: str | None, environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return False
    return bool(
        otlp_endpoint
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
