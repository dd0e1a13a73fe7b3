"""The replicas of each upstream with `[endpoints]`: their discovery, their own aiohttp sessions,
outlier ejection, the reader of their own load, and KV-cache affinity (which replica had a prefix)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from adapters.outbound.memory_affinity import MemoryAffinityStore
from adapters.outbound.openai_compat.replica_sessions import ReplicaSessions
from adapters.outbound.replica_discovery import ReplicaWatch, StaticReplicas
from adapters.outbound.system_clock import SystemClock
from application.replica_care import EjectionListener, KnownListener, ReplicaCare
from application.resume import ResumeListener, Resumes
from config import Config, EndpointsTable, nameserver
from domain.load_reports import LoadReport, saturated_replicas
from ports.affinity import AffinityStore
from ports.discovery import ReplicaDiscovery
from wiring.admission import redis_target

if TYPE_CHECKING:  # imported where used: prometheus_client only after PROMETHEUS_MULTIPROC_DIR is set
    from adapters.outbound.prometheus_metrics import PrometheusMetrics
    from adapters.outbound.vllm_load import VllmLoadScraper  # prometheus_client's parser


def replica_sessions(config: Config) -> dict[str, ReplicaSessions]:
    """A pool of per-replica aiohttp sessions for each upstream with `[endpoints]`."""
    return {name: ReplicaSessions() for name, u in config.upstreams.items() if u.endpoints is not None}


def discovery(name: str, table: EndpointsTable) -> ReplicaDiscovery:
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


def replica_watch(
    config: Config, gate: Any, sessions: Mapping[str, ReplicaSessions], care: ReplicaCare,
    scrapers: Mapping[str, VllmLoadScraper],
) -> ReplicaWatch:
    """One discovery per upstream with `[endpoints]`, for the app's life: every answer goes to the
    gate (which replicas may get new requests), to the upstream's replica sessions, to the
    outlier detection (after the gate) and to the load reader (the replicas it reads)."""
    discoveries = {name: discovery(name, u.endpoints) for name, u in config.upstreams.items() if u.endpoints}

    def tell(upstream: str, ready: frozenset[str]) -> None:
        gate.set_replicas(upstream, ready)
        sessions[upstream].retain(ready)
        care.set_ready(upstream, ready)
        scraper = scrapers.get(upstream)
        if scraper is not None:
            scraper.follow(ready)

    return ReplicaWatch(discoveries, [tell])


def replica_care(config: Config, gate: Any, clock: SystemClock, metrics: PrometheusMetrics) -> ReplicaCare:
    """Outlier ejection per upstream with `[endpoints]` (its policy from the table; `max_ejection_percent
    = 0`: never ejected), the ejections counted and every discovered replica's counter made at 0."""
    policies = {name: u.endpoints.ejection_policy() for name, u in config.upstreams.items() if u.endpoints}
    listeners: list[EjectionListener] = []
    known: list[KnownListener] = []
    if metrics.replicas is not None:
        listeners.append(metrics.replicas.endpoint_ejected)
        known.append(metrics.replicas.endpoints_known)
    return ReplicaCare(gate, clock, policies, listeners, known)


def resumes(config: Config, metrics: PrometheusMetrics) -> Resumes:
    """The upstreams with `[endpoints] resume = "tokens"` and their `max_resumes`; every break of
    their streams counted (`gateway_stream_resumes_total`, at 0 from the start)."""
    limits = {name: u.endpoints.max_resumes for name, u in config.upstreams.items()
              if u.endpoints is not None and u.endpoints.resume == "tokens"}  # fmt: skip
    listeners: list[ResumeListener] = []
    if metrics.replicas is not None:
        metrics.replicas.resumes_known(limits)
        listeners.append(metrics.replicas.stream_resumed)
    return Resumes(limits, listeners)


def load_scrapers(
    config: Config, sessions: Mapping[str, ReplicaSessions], clock: SystemClock
) -> dict[str, VllmLoadScraper]:
    """A reader of the replicas' own load (`GET /metrics`) per upstream with `[endpoints] load_metrics`,
    on the replicas' own sessions; it reads the replicas the discovery watch tells it."""
    from adapters.outbound.vllm_load import VllmLoadScraper

    return {
        name: VllmLoadScraper(name, sessions[name], u.endpoints.load_metrics_interval_seconds, clock)
        for name, u in config.upstreams.items() if u.endpoints is not None and u.endpoints.load_metrics
    }


def _saturation(gate: Any, scraper: VllmLoadScraper, sequence_slots: int) -> Callable[[Mapping[str, LoadReport]], None]:
    """After each round of reads, and when a report expires: the replicas with no room by their own
    account, to the gate."""
    def told(reports: Mapping[str, LoadReport]) -> None:
        gate.set_saturated(scraper.upstream,
                           saturated_replicas(reports, scraper.now(), scraper.interval, sequence_slots))

    return told


async def start_load_scrapers(
    config: Config, gate: Any, metrics: PrometheusMetrics, scrapers: Mapping[str, VllmLoadScraper]
) -> None:
    """Start every load reader (after the discovery watch's first answers) and export its gauges."""
    for name, scraper in scrapers.items():
        endpoints = config.upstreams[name].endpoints
        assert endpoints is not None
        if metrics.replicas is not None:
            metrics.replicas.watch_load(name, scraper)
        await scraper.start(_saturation(gate, scraper, endpoints.sequence_slots))


def affinity_upstreams(config: Config) -> dict[str, int]:
    """Upstream name -> `affinity_max_extra_in_flight`, for each with `[endpoints]` and `affinity = "prefix"`."""
    return {name: u.endpoints.affinity_max_extra_in_flight for name, u in config.upstreams.items()
            if u.endpoints is not None and u.endpoints.affinity == "prefix"}  # fmt: skip


def affinity_store(config: Config) -> AffinityStore | None:
    """What went where (KV-cache affinity): shared by every process on the Redis backend (the
    gate's Redis and key prefix), else this process's; None when no upstream uses affinity."""
    if not affinity_upstreams(config):
        return None
    target = redis_target(config)
    if target is None:
        return MemoryAffinityStore()
    from adapters.outbound.redis_affinity import RedisAffinityStore

    return RedisAffinityStore(target, config.admission.key_prefix)
