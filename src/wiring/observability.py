"""What shows the gateway at work: tracing (only with an exporter), the Prometheus metrics (every
worker's on one scrape with several workers) and the status page's board."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import serving
from adapters.outbound.keys_file import KeysFileStore
from adapters.outbound.system_clock import SystemClock
from adapters.outbound.tracing_switch import tracing_wanted
from config import Config
from wiring.admission import replica_limits

if TYPE_CHECKING:  # imported where used: a process without tracing never loads it
    from adapters.outbound.otel_tracing import OtelTelemetry
    from adapters.outbound.prometheus_metrics import PrometheusMetrics  # after PROMETHEUS_MULTIPROC_DIR is set
    from adapters.outbound.status_board import StatusBoard

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess mode


def telemetry(config: Config) -> Iterator[OtelTelemetry | None]:
    """Tracing only when an exporter is configured: otherwise no spans are made at all."""
    table = config.telemetry
    if not tracing_wanted(table.otlp_endpoint):
        yield None
        return
    from adapters.outbound.otel_tracing import OtelTelemetry

    tracing = OtelTelemetry(table.service_name, table.otlp_endpoint, table.sample_ratio)
    try:
        yield tracing
    finally:
        tracing.shutdown()


def metrics(config: Config, gate: Any) -> PrometheusMetrics:
    """The metrics; with several workers in prometheus_client's multiprocess mode (every worker's
    counters on one scrape), which `gateway serve` turned on before prometheus_client was imported."""
    from adapters.outbound.prometheus_metrics import PrometheusMetrics

    directory = os.environ.get(MULTIPROC_ENV) if config.server.workers > 1 else None
    health = gate.health if config.admission.backend == "redis" else None
    return PrometheusMetrics(gate, redis_health=health, multiprocess_dir=directory,
                             replica_upstreams=list(replica_limits(config)))


def status_board(
    config: Config, gate: Any, metrics: PrometheusMetrics, clock: SystemClock, lifecycle: serving.Lifecycle,
    credentials: KeysFileStore | None,
) -> StatusBoard:
    """What `/status` and `/status.json` show: the gates, the metrics' counts, the replicas."""
    from adapters.outbound.status_board import StatusBoard

    timeouts = {name: u.admission.queue_timeout_seconds for name, u in config.upstreams.items() if u.admission}
    output_weights = {name: u.admission.output_token_weight for name, u in config.upstreams.items() if u.admission}
    return StatusBoard(gate, metrics, clock, ready=lifecycle.ready, backend=config.admission.backend,
                       workers=config.server.workers, queue_timeouts=timeouts,
                       consumer=None if credentials is None else credentials.named,
                       replica_upstreams=list(replica_limits(config)), output_token_weights=output_weights)
