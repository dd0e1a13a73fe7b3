"""Composition root: the only module that knows every concrete class, plus the CLI.

`gateway serve --config PATH` runs the gateway, `gateway check-config --config PATH`
validates a file, `gateway stub --listen HOST:PORT` runs the vLLM-like stub upstream,
`gateway keys new --consumer NAME` makes an API key and its keys-file entry.
`gateway serve` without `--config` runs the embedded demo: two stub upstreams
started as child processes and a config pointing at them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import aiohttp
from dependency_injector import containers, providers
from litestar import Litestar
from litestar.config.cors import CORSConfig

import serving
from adapters.inbound import anthropic, openai, responses
from adapters.inbound._shared.arrivals import ArrivalPacer
from adapters.inbound._shared.dialect import DialectRouter, EdgeContext
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound._shared.http_guard import guarded_protocol
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound._shared.openapi import openapi_config
from adapters.inbound.operations import health_handlers, ops_app
from adapters.outbound.consumer_counters import consumer_concurrency, usage_ledger
from adapters.outbound.edge_observer import EdgeObserver
from adapters.outbound.keys_file import (
    KeysFileError,
    KeysFileStore,
    keys_entry,
    new_key,
    read_keys_file,
    read_salt_secret,
)
from adapters.outbound.memory_affinity import MemoryAffinityStore
from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from adapters.outbound.openai_compat.replica_sessions import ReplicaSessions
from adapters.outbound.replica_discovery import ReplicaWatch, StaticReplicas
from adapters.outbound.request_log import JsonRequestLog
from adapters.outbound.system_clock import SystemClock
from adapters.outbound.tracing_switch import tracing_wanted
from application.affinity import Affinity
from application.chat import ChatService
from application.completions import CompletionService, EmbeddingService
from application.consumer_limits import DEFAULT_WAIT_SECONDS, ConsumerLimits
from application.reasoning import ReasoningBudgets
from application.replica_care import EjectionListener, KnownListener, ReplicaCare
from config import (
    Config,
    ConfigError,
    EndpointsTable,
    dump_config,
    load_config,
    nameserver,
    parse_listen,
    parse_ops_listen,
)
from domain.admission.policy import AdmissionPolicy
from domain.load_reports import LoadReport, saturated_replicas
from domain.routing import ModelRouter
from ports.affinity import AffinityStore
from ports.consumers import ConsumerConcurrency, UsageLedger
from ports.discovery import ReplicaDiscovery

if TYPE_CHECKING:  # imported where used: a process without Redis or tracing never loads them
    from adapters.outbound.otel_tracing import OtelTelemetry
    from adapters.outbound.prometheus_metrics import PrometheusMetrics  # after PROMETHEUS_MULTIPROC_DIR is set
    from adapters.outbound.redis_gate import RedisAdmissionGate
    from adapters.outbound.redis_gate.connection import RedisTarget
    from adapters.outbound.status_board import StatusBoard
    from adapters.outbound.vllm_load import VllmLoadScraper  # prometheus_client's parser: after MULTIPROC_ENV

# The registration point for inbound dialects: a new dialect is one more entry here.
DIALECTS: list[DialectRouter] = [openai.router, anthropic.router, responses.router]

log = logging.getLogger("gateway")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess mode


def _policies(config: Config) -> dict[str, AdmissionPolicy | None]:
    policies: dict[str, AdmissionPolicy | None] = {}
    for name, upstream in config.upstreams.items():
        table = upstream.admission
        policies[name] = None if table is None else AdmissionPolicy(
            max_in_flight=table.max_in_flight,
            queue_depth=table.queue_depth,
            queue_timeout_seconds=table.queue_timeout_seconds,
            fairness=table.fairness,
            max_queued_per_consumer=table.max_queued_per_consumer,
        )
    return policies


def _telemetry(config: Config) -> Iterator[OtelTelemetry | None]:
    """Tracing only when an exporter is configured: otherwise no spans are made at all."""
    telemetry = config.telemetry
    if not tracing_wanted(telemetry.otlp_endpoint):
        yield None
        return
    from adapters.outbound.otel_tracing import OtelTelemetry

    tracing = OtelTelemetry(telemetry.service_name, telemetry.otlp_endpoint, telemetry.sample_ratio)
    try:
        yield tracing
    finally:
        tracing.shutdown()


def _upstream_clients(
    config: Config, sessions: Mapping[str, aiohttp.ClientSession], tracing: OtelTelemetry | None,
    replica_sessions: Mapping[str, ReplicaSessions],
) -> dict[str, OpenAICompatClient]:
    """One client per upstream address, each on its session in `sessions` (by upstream name);
    an upstream with `[endpoints]` calls the chosen replica on that replica's own session."""
    return {
        name: OpenAICompatClient(
            sessions,
            name=name,
            base_url=upstream.url,
            connect_timeout=upstream.connect_timeout_seconds,
            first_byte_timeout=upstream.first_byte_timeout_seconds,
            idle_timeout=upstream.idle_timeout_seconds,
            tracer=tracing,
            replicas=replica_sessions.get(name),
        )
        for name, upstream in config.upstreams.items()
    }


def _replica_limits(config: Config) -> dict[str, int]:
    """Upstream name -> `[endpoints] max_in_flight` (the most one replica gets), for the gates."""
    return {name: u.endpoints.max_in_flight for name, u in config.upstreams.items() if u.endpoints is not None}


def _replica_sessions(config: Config) -> dict[str, ReplicaSessions]:
    """A pool of per-replica aiohttp sessions for each upstream with `[endpoints]`."""
    return {name: ReplicaSessions() for name, u in config.upstreams.items() if u.endpoints is not None}


def _discovery(name: str, table: EndpointsTable) -> ReplicaDiscovery:
    """`urls`: fixed (told once at start); `dns`: re-resolved every `refresh_seconds` in the background."""
    if isinstance(table.urls, list):
        return StaticReplicas(table.replica_urls())
    from adapters.outbound.replica_discovery.dns_records import DnsReplicas  # dnspython: only for `dns`

    assert isinstance(table.dns, str) and isinstance(table.port, int)  # config checks and fills them
    servers = table.nameservers if isinstance(table.nameservers, list) else []
    return DnsReplicas(
        name, table.dns, table.port, scheme=table.scheme if isinstance(table.scheme, str) else "http",
        refresh_seconds=table.refresh_seconds if isinstance(table.refresh_seconds, float | int) else 5.0,
        nameservers=[nameserver(server) for server in servers],
    )


def _replica_watch(
    config: Config, gate: Any, replica_sessions: Mapping[str, ReplicaSessions], care: ReplicaCare,
    scrapers: Mapping[str, VllmLoadScraper],
) -> ReplicaWatch:
    """One discovery per upstream with `[endpoints]`, for the app's life: every answer goes to the
    gate (which replicas may get new requests), to the upstream's replica sessions, to the
    outlier detection (after the gate) and to the load reader (the replicas it reads)."""
    discoveries = {name: _discovery(name, u.endpoints) for name, u in config.upstreams.items() if u.endpoints}

    def tell(upstream: str, ready: frozenset[str]) -> None:
        gate.set_replicas(upstream, ready)
        replica_sessions[upstream].retain(ready)
        care.set_ready(upstream, ready)
        scraper = scrapers.get(upstream)
        if scraper is not None:
            scraper.follow(ready)

    return ReplicaWatch(discoveries, [tell])


def _replica_care(config: Config, gate: Any, clock: SystemClock, metrics: PrometheusMetrics) -> ReplicaCare:
    """Outlier ejection per upstream with `[endpoints]` (its policy from the table; `max_ejection_percent
    = 0`: never ejected), the ejections counted and every discovered replica's counter made at 0."""
    policies = {name: u.endpoints.ejection_policy() for name, u in config.upstreams.items() if u.endpoints}
    listeners: list[EjectionListener] = []
    known: list[KnownListener] = []
    if metrics.replicas is not None:
        listeners.append(metrics.replicas.endpoint_ejected)
        known.append(metrics.replicas.endpoints_known)
    return ReplicaCare(gate, clock, policies, listeners, known)


def _load_scrapers(
    config: Config, replica_sessions: Mapping[str, ReplicaSessions], clock: SystemClock
) -> dict[str, VllmLoadScraper]:
    """A reader of the replicas' own load (`GET /metrics`) per upstream with `[endpoints] load_metrics`,
    on the replicas' own sessions; it reads the replicas the discovery watch tells it."""
    from adapters.outbound.vllm_load import VllmLoadScraper

    return {
        name: VllmLoadScraper(name, replica_sessions[name], u.endpoints.load_metrics_interval_seconds, clock)
        for name, u in config.upstreams.items() if u.endpoints is not None and u.endpoints.load_metrics
    }


def _saturation(gate: Any, scraper: VllmLoadScraper, sequence_slots: int) -> Callable[[Mapping[str, LoadReport]], None]:
    """After each round of reads, and when a report expires: the replicas with no room by their own
    account, to the gate."""
    def told(reports: Mapping[str, LoadReport]) -> None:
        gate.set_saturated(scraper.upstream,
                           saturated_replicas(reports, scraper.now(), scraper.interval, sequence_slots))

    return told


async def _start_load_scrapers(container: Container) -> None:
    """Start every load reader (after the discovery watch's first answers) and export its gauges."""
    config, gate, metrics = container.config(), container.gate(), container.metrics()
    for name, scraper in container.load_scrapers().items():
        endpoints = config.upstreams[name].endpoints
        assert endpoints is not None
        if metrics.replicas is not None:
            metrics.replicas.watch_load(name, scraper)
        await scraper.start(_saturation(gate, scraper, endpoints.sequence_slots))


async def _upstream_sessions(
    config: Config, sessions: dict[str, aiohttp.ClientSession]
) -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """One aiohttp session per upstream address, opened in the serving loop and closed at shutdown.

    aiohttp binds a session to the running event loop, while the clients (and everything
    built on them) are made before it runs: the clients share `sessions`, filled here.
    """
    for name, upstream in config.upstreams.items():
        sessions[name] = upstream_session(upstream.url)
    try:
        yield sessions
    finally:
        opened = list(sessions.values())
        sessions.clear()
        await asyncio.gather(*(session.close() for session in opened))


def _redis_target(config: Config) -> RedisTarget | None:
    """Where Redis is ([admission]: one URL, Sentinels, or a cluster); None with the memory backend."""
    shared = config.admission
    if shared.backend != "redis":
        return None
    from adapters.outbound.redis_gate.connection import RedisTarget

    sentinels = tuple(parse_listen(s, "admission.redis_sentinels") for s in shared.redis_sentinels or ())
    return RedisTarget(url=shared.redis_url, sentinels=sentinels, sentinel_master=shared.redis_sentinel_master,
                       cluster=shared.redis_cluster)


def _gate(config: Config, clock: SystemClock) -> InMemoryAdmissionGate | RedisAdmissionGate:
    """The admission backend: one process (memory) or every process and pod (Redis)."""
    shared = config.admission
    target = _redis_target(config)
    limits = _replica_limits(config)
    if target is None:
        return InMemoryAdmissionGate(_policies(config), clock, replica_limits=limits)
    from adapters.outbound.redis_gate import RedisAdmissionGate

    return RedisAdmissionGate(
        _policies(config), clock, target, shared.lease_seconds, shared.key_prefix,
        on_fenced=_fenced, replica_limits=limits,
    )


def _affinity_upstreams(config: Config) -> dict[str, int]:
    """Upstream name -> `affinity_max_extra_in_flight`, for each with `[endpoints]` and `affinity = "prefix"`."""
    return {name: u.endpoints.affinity_max_extra_in_flight for name, u in config.upstreams.items()
            if u.endpoints is not None and u.endpoints.affinity == "prefix"}  # fmt: skip


def _affinity_store(config: Config) -> AffinityStore | None:
    """What went where (KV-cache affinity): shared by every process on the Redis backend (the
    gate's Redis and key prefix), else this process's; None when no upstream uses affinity."""
    if not _affinity_upstreams(config):
        return None
    target = _redis_target(config)
    if target is None:
        return MemoryAffinityStore()
    from adapters.outbound.redis_affinity import RedisAffinityStore

    return RedisAffinityStore(target, config.admission.key_prefix)


def _fenced(reason: str, lost: int) -> None:
    # Every lost lease has its `lost` event set; ChatService aborts the requests holding one.
    log.error("admission: this process was fenced (%s); %d slot lease(s) lost", reason, lost)


def _metrics(config: Config, gate: Any) -> PrometheusMetrics:
    """The metrics; with several workers in prometheus_client's multiprocess mode (every worker's
    counters on one scrape), which `_serve` turned on before prometheus_client was imported."""
    from adapters.outbound.prometheus_metrics import PrometheusMetrics

    directory = os.environ.get(MULTIPROC_ENV) if config.server.workers > 1 else None
    health = gate.health if config.admission.backend == "redis" else None
    return PrometheusMetrics(gate, redis_health=health, multiprocess_dir=directory,
                             replica_upstreams=list(_replica_limits(config)))


def _status_board(
    config: Config, gate: Any, metrics: PrometheusMetrics, clock: SystemClock, lifecycle: serving.Lifecycle,
    credentials: KeysFileStore | None,
) -> StatusBoard:
    from adapters.outbound.status_board import StatusBoard

    timeouts = {name: u.admission.queue_timeout_seconds for name, u in config.upstreams.items() if u.admission}
    return StatusBoard(gate, metrics, clock, ready=lifecycle.ready, backend=config.admission.backend,
                       workers=config.server.workers, queue_timeouts=timeouts,
                       consumer=None if credentials is None else credentials.named,
                       replica_upstreams=list(_replica_limits(config)))


def _router(config: Config) -> ModelRouter:
    upstreams = config.upstreams
    return ModelRouter({n: u.models for n, u in upstreams.items()}, {n: u.aliases for n, u in upstreams.items()})


def _input_limits(config: Config, router: ModelRouter | None = None) -> InputLimits:
    """The edge's input limits; `max_output_tokens` is per upstream, looked up per model (aliases too)."""
    server = config.server
    caps = (router or _router(config)).per_model(
        {name: u.max_output_tokens for name, u in config.upstreams.items() if u.max_output_tokens is not None}
    )
    return InputLimits(
        max_header_bytes=server.max_header_bytes, body_timeout_seconds=server.body_timeout_seconds,
        max_messages=server.max_messages, max_content_blocks=server.max_content_blocks, max_output_tokens=caps,
        max_stop_sequences=server.max_stop_sequences, max_tools=server.max_tools,
        max_tool_schema_bytes=server.max_tool_schema_bytes, media_url_schemes=frozenset(server.media_url_schemes),
        max_choices=(router or _router(config)).per_model({n: u.max_choices for n, u in config.upstreams.items()}),
    )


def _credentials(config: Config) -> KeysFileStore | None:
    """The keys file when keys are required; None: every request is anonymous."""
    auth = config.auth
    if auth.mode == "off":
        return None
    assert auth.keys_file is not None  # config checks it
    secret = None if auth.cache_salt_secret_file is None else read_salt_secret(auth.cache_salt_secret_file)
    return KeysFileStore(auth.keys_file, auth.reload_interval_seconds, secret)


def _usage_ledger(config: Config) -> UsageLedger | None:
    """Request and token counters of the consumers (only with keys: else all are anonymous)."""
    if config.auth.mode == "off":
        return None
    shared = config.admission
    return usage_ledger(shared.backend, _redis_target(config), shared.key_prefix)


def _consumer_concurrency(config: Config) -> ConsumerConcurrency | None:
    """`max_in_flight` per consumer, on the admission gate's backend."""
    if config.auth.mode == "off":
        return None
    shared = config.admission
    return consumer_concurrency(shared.backend, _redis_target(config), shared.key_prefix, shared.lease_seconds)


def _consumer_limits(
    config: Config, usage: UsageLedger | None, concurrency: ConsumerConcurrency | None
) -> ConsumerLimits:
    """A consumer waits for its own slot (before its body is read, so before its upstream is known)
    at most as long as the longest upstream queue would let it wait."""
    waits = [u.admission.queue_timeout_seconds for u in config.upstreams.values() if u.admission]
    return ConsumerLimits(usage, concurrency, max(waits, default=DEFAULT_WAIT_SECONDS),
                          config.auth.max_waiting_per_consumer)


def _check_keys_file(config: Config) -> None:
    """A bad keys file stops `serve` before it listens, like a bad config (exit 2)."""
    if config.auth.mode == "required" and config.auth.keys_file is not None:
        try:
            read_keys_file(config.auth.keys_file)
        except KeysFileError as error:
            raise ConfigError(f"auth.keys_file: {error}") from None
        if config.auth.cache_salt_secret_file is not None:
            try:
                read_salt_secret(config.auth.cache_salt_secret_file)
            except KeysFileError as error:
                raise ConfigError(f"auth.cache_salt_secret_file: {error}") from None


def _lifespan(container: Container) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        credentials = container.credentials()
        if credentials is not None:
            await credentials.start()  # before serving: no request is ever checked against nothing
        counters = [c for c in (container.usage(), container.consumer_concurrency()) if c is not None]
        try:
            await container.init_resources()  # type: ignore[misc]  # the upstream sessions are async
            gate = container.gate()
            await gate.start()
            replicas = container.replica_watch()
            await replicas.start()  # the first answers reach the gate before the first request
            await _start_load_scrapers(container)
            for counter in counters:
                await counter.start()
            status = container.status_board()
            await status.start()
            try:
                yield
            finally:
                await status.close()
                for counter in counters:
                    await counter.close()
                await replicas.close()
                await asyncio.gather(*(scraper.close() for scraper in container.load_scrapers().values()))
                container.replica_care().close()
                await gate.close()
                affinity = container.affinity_store()
                if affinity is not None:
                    await affinity.close()
                await asyncio.gather(*(pool.close() for pool in container.replica_sessions().values()))
                await container.shutdown_resources()  # type: ignore[misc]
        finally:
            if credentials is not None:
                await credentials.close()

    return lifespan


def _litestar_app(
    config: Config, dialects: Sequence[DialectRouter], context: EdgeContext,
    lifecycle: serving.Lifecycle, container: Container,
) -> EdgeMiddleware:
    """Every registered dialect's Router plus the health endpoints, on one Litestar app (the
    metrics and the status page are on the ops listener's app: `ops_app`), wrapped in the
    edge middleware (`edge.EdgeMiddleware`: its `app` is the Litestar app)."""
    handlers: list[Any] = [dialect(context) for dialect in dialects]
    handlers += health_handlers(lifecycle.ready, container.replica_watch().without_replicas)
    server = config.server
    cors = (
        CORSConfig(allow_origins=server.cors_allowed_origins, allow_methods=["GET", "POST", "OPTIONS"],
                   allow_headers=["*"], expose_headers=["request-id", "x-request-id", "retry-after"])
        if server.cors_allowed_origins
        else None
    )
    app = Litestar(route_handlers=handlers, lifespan=[_lifespan(container)], cors_config=cors,
                   openapi_config=openapi_config(version("gateway")), logging_config=None)
    app.state.container = container
    return EdgeMiddleware(app, container.arrivals())


def _arrivals(config: Config) -> ArrivalPacer | None:
    """The process's pacer of new requests (`arrivals.ArrivalPacer`), unless turned off (0)."""
    per_turn = config.server.starts_per_loop_turn
    return ArrivalPacer(per_turn) if per_turn else None


class Container(containers.DeclarativeContainer):
    """Builds everything: the Litestar app, its dialect Routers, the upstream clients, the gate."""

    __self__ = providers.Self()
    config = providers.Dependency(instance_of=Config)
    dialects = providers.Dependency(instance_of=list, default=DIALECTS)
    clock = providers.Singleton(SystemClock)
    lifecycle = providers.Singleton(serving.Lifecycle)
    router = providers.Singleton(lambda c: _router(c), config)
    arrivals = providers.Singleton(lambda c: _arrivals(c), config)
    gate = providers.Singleton(lambda c, clock: _gate(c, clock), config, clock)
    credentials = providers.Singleton(lambda c: _credentials(c), config)
    tracing = providers.Resource(_telemetry, config)
    # upstream name -> its aiohttp session, filled and emptied by the resource below
    sessions: providers.Singleton[dict[str, aiohttp.ClientSession]] = providers.Singleton(dict)
    upstream_sessions = providers.Resource(_upstream_sessions, config, sessions)
    replica_sessions = providers.Singleton(_replica_sessions, config)
    upstreams = providers.Singleton(_upstream_clients, config, sessions, tracing, replica_sessions)
    metrics = providers.Singleton(_metrics, config, gate)
    # Replica health (outlier ejection, the one safe retry) and the replicas' own load.
    replica_care = providers.Singleton(_replica_care, config, gate, clock, metrics)
    load_scrapers = providers.Singleton(_load_scrapers, config, replica_sessions, clock)
    replica_watch = providers.Singleton(_replica_watch, config, gate, replica_sessions, replica_care, load_scrapers)
    usage = providers.Singleton(lambda c: _usage_ledger(c), config)
    consumer_concurrency = providers.Singleton(lambda c: _consumer_concurrency(c), config)
    consumer_limits = providers.Singleton(_consumer_limits, config, usage, consumer_concurrency)
    affinity_store = providers.Singleton(lambda c: _affinity_store(c), config)
    affinity = providers.Singleton(lambda c, store: Affinity(store, _affinity_upstreams(c)), config, affinity_store)
    service = providers.Singleton(
        lambda c, router, upstreams, gate, clock, tracing, consumers, affinity, care: ChatService(
            router, upstreams, gate, c.server.queue_update_interval_seconds, clock, tracing, consumers, affinity, care,
            ReasoningBudgets({name: u.reasoning for name, u in c.upstreams.items()}, clock),
        ),
        config, router, upstreams, gate, clock, tracing, consumer_limits, affinity, replica_care,
    )
    # Text completions and embeddings: the same upstream clients, gates, consumer limits and replica care.
    completions = providers.Singleton(
        CompletionService, router, upstreams, gate, clock, tracing, consumer_limits, affinity, replica_care)
    embeddings = providers.Singleton(
        EmbeddingService, router, upstreams, gate, clock, tracing, consumer_limits, replica_care)
    status_board = providers.Singleton(_status_board, config, gate, metrics, clock, lifecycle, credentials)
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
            ping_interval_seconds=c.server.ping_interval_seconds, limits=_input_limits(c, router),
            options={"queue_events": c.server.queue_events}, credentials=credentials,
            completions=completions, embeddings=embeddings,
        ),
        config, router, service, observer, credentials, completions, embeddings,
    )
    app = providers.Singleton(_litestar_app, config, dialects, edge_context, lifecycle, __self__)


def build_app(config: Config, dialects: Sequence[DialectRouter] | None = None) -> EdgeMiddleware:
    """The app `gateway serve` runs: built by the container (tests may pass their dialects)."""
    container = Container(config=config) if dialects is None else Container(config=config, dialects=list(dialects))
    app: EdgeMiddleware = container.app()
    return app


# --- CLI ---------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    if args.config is None:
        from demo import demo_config

        config, stop_stubs = demo_config()
    else:
        config, stop_stubs = load_config(args.config), None
    host, port = parse_listen(config.server.listen)
    _check_keys_file(config)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    server = config.server
    grace = server.drain_grace_seconds
    # The server's protocol bounds the request head below the app (SECURITY.md).
    protocol = guarded_protocol(2 * server.max_header_bytes, server.header_timeout_seconds,
                                server.client_write_timeout_seconds)
    limit, keep_alive = server.limit_concurrency, server.keep_alive_timeout_seconds

    def build() -> tuple[EdgeMiddleware, Any, Litestar]:
        app = build_app(config)
        container = app.app.state.container
        return app, serving.make_drain(container.lifecycle(), container.gate(), grace), container.ops_app()

    metrics_dir = _multiprocess_metrics() if server.workers > 1 else None
    ops_socket = _ops_socket(config)
    try:
        if server.workers > 1:
            return serving.run_workers(server.workers, host, port, grace, build, http_protocol=protocol,
                                       limit_concurrency=limit, keep_alive=keep_alive, ops_socket=ops_socket)
        app, drain, ops = build()
        serving.run(app, host, port, drain, grace, http_protocol=protocol, limit_concurrency=limit,
                    keep_alive=keep_alive, ops=serving.Ops(ops, ops_socket))
    finally:
        ops_socket.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if stop_stubs is not None:
            stop_stubs()
    return 0


def _ops_socket(config: Config) -> socket.socket:
    """The ops listener's socket, bound before anything starts: a taken port stops startup."""
    host, port = parse_ops_listen(config)
    try:
        sock = serving.listen_socket(host, port)
    except OSError as error:
        raise ConfigError(f"[ops] listen = '{config.ops.listen}': cannot listen there ({error.strerror})") from None
    bound = sock.getsockname()[1]
    log.info("gateway ops listening on http://%s:%d (/metrics /healthz /readyz /status)", host, bound)
    return sock


def _multiprocess_metrics() -> str:
    """A fresh directory for every worker's metric files, set before prometheus_client is loaded."""
    if "prometheus_client" in sys.modules:  # its multiprocess mode is chosen at import
        raise RuntimeError("prometheus_client was imported before the workers' metrics directory was set")
    directory = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ[MULTIPROC_ENV] = directory
    return directory


def _check_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    try:
        print(dump_config(config), flush=True)
    except BrokenPipeError:  # `| head` stopped reading: the check itself passed
        # Python's advice: point stdout at devnull, so the flush at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _keys_new(args: argparse.Namespace) -> int:
    """Print a new key once, and the keys-file lines holding its digest (the only thing stored)."""
    key = new_key()
    print(f"key: {key}")
    print("# Shown once: store the key now. Add these lines to the keys file ([auth] keys_file):")
    print(keys_entry(args.consumer, key), end="")
    return 0


def _stub(args: argparse.Namespace) -> int:
    from stub.cli import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    from stub.cli import add_arguments as add_stub_arguments

    parser = argparse.ArgumentParser(prog="gateway", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="TOML config file (default: the embedded stub demo)")
    serve.set_defaults(run=_serve)
    check = commands.add_parser("check-config", help="validate a config file and print it")
    check.add_argument("--config", required=True)
    check.set_defaults(run=_check_config)
    keys = commands.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    new = keys.add_parser("new", help="make a new API key and print its keys-file entry")
    new.add_argument("--consumer", required=True, help="the consumer (keys-file table name) the key is for")
    new.set_defaults(run=_keys_new)
    stub = commands.add_parser("stub", help="run the vLLM-compatible stub upstream")
    add_stub_arguments(stub)
    stub.set_defaults(run=_stub)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as error:
        print(f"gateway: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
