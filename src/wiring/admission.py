"""Admission: each upstream's policy, the gate on its backend (this process's memory, or Redis
shared by every process and pod) and where that Redis is."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.system_clock import SystemClock
from config import Config, parse_listen
from domain.admission.policy import AdmissionPolicy

if TYPE_CHECKING:  # imported where used: a process without Redis never loads it
    from adapters.outbound.redis_gate import RedisAdmissionGate
    from adapters.outbound.redis_gate.connection import RedisTarget

log = logging.getLogger("gateway")


def policies(config: Config) -> dict[str, AdmissionPolicy | None]:
    """Upstream name -> its admission policy; None: the upstream is not capped."""
    found: dict[str, AdmissionPolicy | None] = {}
    for name, upstream in config.upstreams.items():
        table = upstream.admission
        found[name] = None if table is None else AdmissionPolicy(
            max_in_flight=table.max_in_flight,
            queue_depth=table.queue_depth,
            queue_timeout_seconds=table.queue_timeout_seconds,
            fairness=table.fairness,
            max_queued_per_consumer=table.max_queued_per_consumer,
            output_token_weight=table.output_token_weight,
        )
    return found


def replica_limits(config: Config) -> dict[str, int]:
    """Upstream name -> `[endpoints] max_in_flight` (the most one replica gets), for the gates."""
    return {name: u.endpoints.max_in_flight for name, u in config.upstreams.items() if u.endpoints is not None}


def redis_target(config: Config) -> RedisTarget | None:
    """Where Redis is ([admission]: one URL, Sentinels, or a cluster); None with the memory backend."""
    shared = config.admission
    if shared.backend != "redis":
        return None
    from adapters.outbound.redis_gate.connection import RedisTarget

    sentinels = tuple(parse_listen(s, "admission.redis_sentinels") for s in shared.redis_sentinels or ())
    return RedisTarget(url=shared.redis_url, sentinels=sentinels, sentinel_master=shared.redis_sentinel_master,
                       cluster=shared.redis_cluster)


def gate(config: Config, clock: SystemClock) -> InMemoryAdmissionGate | RedisAdmissionGate:
    """The admission backend: one process (memory) or every process and pod (Redis)."""
    shared = config.admission
    target = redis_target(config)
    limits = replica_limits(config)
    if target is None:
        return InMemoryAdmissionGate(policies(config), clock, replica_limits=limits)
    from adapters.outbound.redis_gate import RedisAdmissionGate

    return RedisAdmissionGate(
        policies(config), clock, target, shared.lease_seconds, shared.key_prefix,
        on_fenced=_fenced, replica_limits=limits,
    )


def _fenced(reason: str, lost: int) -> None:
    # Every lost lease has its `lost` event set; ChatService aborts the requests holding one.
    log.error("admission: this process was fenced (%s); %d slot lease(s) lost", reason, lost)
