"""`[admission]`: where the admission ledger lives (this process's memory, or Redis) and how
Redis is reached."""

from __future__ import annotations

from typing import Literal

from config.addresses import parse_listen
from config.section import ConfigError, PositiveFloat, Section


class SharedAdmissionConfig(Section):
    backend: Literal["memory", "redis"] = "memory"
    # Where Redis is (exactly one of the two): a URL (one server, or a cluster's seed node with
    # `redis_cluster = true`), or Sentinel addresses and the master's name (docs/redis-ledger.md).
    redis_url: str | None = None
    redis_sentinels: list[str] | None = None
    redis_sentinel_master: str | None = None
    redis_cluster: bool = False
    lease_seconds: PositiveFloat = 10.0
    key_prefix: str = "gateway"


def check_redis(shared: SharedAdmissionConfig) -> None:
    """Exactly one way to reach Redis: a URL (one server or a cluster seed) or Sentinels."""
    sentinels = shared.redis_sentinels
    if shared.redis_url and sentinels is not None:
        raise ConfigError("admission.redis_url and admission.redis_sentinels: set exactly one of them")
    if shared.backend == "redis" and not shared.redis_url and sentinels is None:
        raise ConfigError(
            "admission.redis_url is required when admission.backend = 'redis' (or admission.redis_sentinels)")
    if sentinels is not None:
        if not sentinels:
            raise ConfigError("admission.redis_sentinels must list at least one HOST:PORT")
        for i, address in enumerate(sentinels):
            parse_listen(address, f"admission.redis_sentinels[{i}]")
        if not shared.redis_sentinel_master:
            raise ConfigError("admission.redis_sentinel_master is required with admission.redis_sentinels")
        if shared.redis_cluster:
            raise ConfigError("admission.redis_cluster needs admission.redis_url (a cluster node), "
                              "not admission.redis_sentinels")
    elif shared.redis_sentinel_master is not None:
        raise ConfigError("admission.redis_sentinel_master is only used with admission.redis_sentinels")
    if shared.redis_cluster and ("{" in shared.key_prefix or "}" in shared.key_prefix):
        raise ConfigError("admission.key_prefix must not contain '{' or '}' with admission.redis_cluster "
                          "(the keys' hash tags keep each upstream in one cluster slot)")
