"""Composition root: the only module that knows every concrete class.

`Container` builds the object graph (the Litestar app, its dialect Routers, the upstream
clients, the gates) from factories grouped by concern in `wiring`; `DIALECTS` is where
inbound dialects are registered. The command line (`gateway serve ...`) is `cli`.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp
from dependency_injector import containers, providers

import serving
from adapters.inbound import anthropic, openai, responses
from adapters.inbound._shared.dialect import DialectRouter, EdgeContext
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound.operations import ops_app
from adapters.outbound.edge_observer import EdgeObserver
from adapters.outbound.request_log import JsonRequestLog
from adapters.outbound.system_clock import SystemClock
from application.affinity import Affinity
from application.chat import ChatService
from application.completions import CompletionService, EmbeddingService
from application.reasoning import ReasoningBudgets
from config import Config
from wiring import admission, consumers, http_app, observability, replicas
from wiring import upstreams as upstream_wiring  # `upstreams` is the container's clients

# The registration point for inbound dialects: a new dialect is one more entry here.
DIALECTS: list[DialectRouter] = [openai.router, anthropic.router, responses.router]


class Container(containers.DeclarativeContainer):
    """Builds everything: the Litestar app, its dialect Routers, the upstream clients, the gate."""

    __self__ = providers.Self()
    config = providers.Dependency(instance_of=Config)
    dialects = providers.Dependency(instance_of=list, default=DIALECTS)
    clock = providers.Singleton(SystemClock)
    lifecycle = providers.Singleton(serving.Lifecycle)
    router = providers.Singleton(lambda c: upstream_wiring.model_router(c), config)
    arrivals = providers.Singleton(lambda c: http_app.arrivals(c), config)
    gate = providers.Singleton(lambda c, clock: admission.gate(c, clock), config, clock)
    credentials = providers.Singleton(lambda c: consumers.credentials(c), config)
    tracing = providers.Resource(observability.telemetry, config)
    # upstream name -> its aiohttp session, filled and emptied by the resource below
    sessions: providers.Singleton[dict[str, aiohttp.ClientSession]] = providers.Singleton(dict)
    upstream_sessions = providers.Resource(upstream_wiring.upstream_sessions, config, sessions)
    replica_sessions = providers.Singleton(replicas.replica_sessions, config)
    upstreams = providers.Singleton(upstream_wiring.upstream_clients, config, sessions, tracing, replica_sessions)
    metrics = providers.Singleton(observability.metrics, config, gate)
    # Replica health (outlier ejection, the one safe retry) and the replicas' own load.
    replica_care = providers.Singleton(replicas.replica_care, config, gate, clock, metrics)
    load_scrapers = providers.Singleton(replicas.load_scrapers, config, replica_sessions, clock)
    resumes = providers.Singleton(replicas.resumes, config, metrics)  # a broken stream goes on elsewhere
    replica_watch = providers.Singleton(
        replicas.replica_watch, config, gate, replica_sessions, replica_care, load_scrapers)
    usage = providers.Singleton(lambda c: consumers.usage_ledger(c), config)
    consumer_concurrency = providers.Singleton(lambda c: consumers.consumer_concurrency(c), config)
    consumer_limits = providers.Singleton(consumers.consumer_limits, config, usage, consumer_concurrency)
    affinity_store = providers.Singleton(lambda c: replicas.affinity_store(c), config)
    affinity = providers.Singleton(
        lambda c, store: Affinity(store, replicas.affinity_upstreams(c)), config, affinity_store)
    service = providers.Singleton(
        lambda c, router, upstreams, gate, clock, tracing, consumers, affinity, care, resumes: ChatService(
            router, upstreams, gate, c.server.queue_update_interval_seconds, clock, tracing, consumers, affinity, care,
            ReasoningBudgets({name: u.reasoning for name, u in c.upstreams.items()}, clock), resumes,
        ),
        config, router, upstreams, gate, clock, tracing, consumer_limits, affinity, replica_care, resumes,
    )
    # Text completions and embeddings: the same upstream clients, gates, consumer limits and replica care.
    completions = providers.Singleton(
        CompletionService, router, upstreams, gate, clock, tracing, consumer_limits, affinity, replica_care, resumes)
    embeddings = providers.Singleton(
        EmbeddingService, router, upstreams, gate, clock, tracing, consumer_limits, replica_care)
    status_board = providers.Singleton(
        observability.status_board, config, gate, metrics, clock, lifecycle, credentials)
    ops_app = providers.Singleton(
        lambda metrics, lifecycle, status, watch: ops_app(metrics.render, lifecycle.ready, status,
                                                         watch.without_replicas),
        metrics, lifecycle, status_board, replica_watch,
    )
    request_log = providers.Singleton(lambda c: JsonRequestLog(enabled=c.server.access_log), config)
    observer = providers.Singleton(
        lambda log, metrics, tracing: EdgeObserver(log, metrics, tracing=tracing), request_log, metrics, tracing
    )
    edge_context = providers.Singleton(
        lambda c, router, service, observer, credentials, completions, embeddings: EdgeContext(
            service=service, observer=observer, max_body_bytes=c.server.max_body_bytes,
            ping_interval_seconds=c.server.ping_interval_seconds, limits=http_app.input_limits(c, router),
            options={"queue_events": c.server.queue_events}, credentials=credentials,
            completions=completions, embeddings=embeddings, problem_base_url=c.server.problem_base_url,
        ),
        config, router, service, observer, credentials, completions, embeddings,
    )
    app = providers.Singleton(http_app.litestar_app, config, dialects, edge_context, lifecycle, __self__)


def build_app(config: Config, dialects: Sequence[DialectRouter] | None = None) -> EdgeMiddleware:
    """The app `gateway serve` runs: built by the container (tests may pass their dialects)."""
    container = Container(config=config) if dialects is None else Container(config=config, dialects=list(dialects))
    app: EdgeMiddleware = container.app()
    return app


if __name__ == "__main__":  # the command line is cli.py (`gateway`): say so rather than do nothing
    raise SystemExit("bootstrap.py is the composition root, not a command: run `gateway` (python -m cli)")
