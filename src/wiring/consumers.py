"""The consumers: the keys file that names them, their usage counters and their own in-flight
caps, on the admission gate's backend (only with keys: without, every request is anonymous)."""

from __future__ import annotations

from adapters.outbound import consumer_counters
from adapters.outbound.keys_file import KeysFileStore, read_salt_secret
from application.consumer_limits import DEFAULT_WAIT_SECONDS, ConsumerLimits
from config import Config
from ports.consumers import ConsumerConcurrency, UsageLedger
from wiring.admission import redis_target


def credentials(config: Config) -> KeysFileStore | None:
    """The keys file when keys are required; None: every request is anonymous."""
    auth = config.auth
    if auth.mode == "off":
        return None
    assert auth.keys_file is not None  # config checks it
    secret = None if auth.cache_salt_secret_file is None else read_salt_secret(auth.cache_salt_secret_file)
    return KeysFileStore(auth.keys_file, auth.reload_interval_seconds, secret)


def usage_ledger(config: Config) -> UsageLedger | None:
    """Request and token counters of the consumers (only with keys: else all are anonymous)."""
    if config.auth.mode == "off":
        return None
    shared = config.admission
    return consumer_counters.usage_ledger(shared.backend, redis_target(config), shared.key_prefix)


def consumer_concurrency(config: Config) -> ConsumerConcurrency | None:
    """`max_in_flight` per consumer, on the admission gate's backend."""
    if config.auth.mode == "off":
        return None
    shared = config.admission
    return consumer_counters.consumer_concurrency(shared.backend, redis_target(config), shared.key_prefix,
                                                  shared.lease_seconds)


def consumer_limits(
    config: Config, usage: UsageLedger | None, concurrency: ConsumerConcurrency | None
) -> ConsumerLimits:
    """A consumer waits for its own slot (before its body is read, so before its upstream is known)
    at most as long as the longest upstream queue would let it wait."""
    waits = [u.admission.queue_timeout_seconds for u in config.upstreams.values() if u.admission]
    return ConsumerLimits(usage, concurrency, max(waits, default=DEFAULT_WAIT_SECONDS),
                          config.auth.max_waiting_per_consumer)
