"""The gate's three background loops; each survives Redis outages and never exits early.

- heartbeat: renews this process's owner lease every lease_seconds/3, detects fencing
  (the server says the lease expired, or Redis was unreachable for lease_seconds), then
  retries deferred releases/cancels and purges fenced identities;
- listener: ONE pub/sub connection subscribed to every capped upstream's wake channel,
  dispatching promoted tokens to local waiters; it resubscribes after a failure and
  then nudges every local waiter to poll, since messages published meanwhile are lost;
- refresher: one pipelined `maintain` script per capped upstream every refresh interval
  (0.5 s): keeps the snapshot cache fresh and reclaims dead owners' slots even when no
  request arrives, so a waiter in another process is promoted within that interval. Like
  every script call it carries the token service charged here and not yet sent
  (`fairness = "tokens"`), so a long stream's charges reach the ledger within that interval
  even when nothing else calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from adapters.outbound.redis_gate import scripts
from adapters.outbound.redis_gate.connection import REDIS_DOWN
from adapters.outbound.redis_gate.ledger import LedgerCore, RedisHealth

__all__ = ["REDIS_DOWN", "RedisHealth", "dispatch", "flush_pending", "heartbeat_loop", "listen_loop",
           "read_oldest", "refresh_loop"]

log = logging.getLogger("gateway.admission.redis")
_EARLY_LIMIT = 1024  # promoted tokens remembered before their ticket is known
_RETRY_SECONDS = 0.5  # pause before resubscribing after a pub/sub failure


async def heartbeat_loop(gate: LedgerCore) -> None:
    lease_ms = int(gate._lease * 1000)
    failing = False
    while not gate._closed:  # not only cancellation: 3.11's asyncio.timeout can swallow it
        await asyncio.sleep(gate._lease / 3)
        started = gate._clock.now()
        if gate._registered and started - gate._last_renewal >= gate._lease:
            # paused, or Redis unreachable, for a whole lease: others may own our slots
            gate._fence("heartbeat lease expired before it could be renewed", gate._owner)
        try:
            if not gate._registered:
                await gate._register()
            else:
                owner = gate._owner
                codes = await gate._pipeline("heartbeat", owner, lease_ms, 0)
                if scripts.FENCED in codes:
                    gate._fence("heartbeat found this process's lease expired", owner)
                    await gate._register()
                elif owner == gate._owner:
                    gate._last_renewal = started
            await flush_pending(gate)
            gate.health.reachable = True
            if failing:
                log.warning("redis admission: Redis reachable again")
                failing = False
        except REDIS_DOWN as error:
            gate.health.reachable = False
            gate.health.heartbeat_failures += 1
            if not failing:
                log.warning("redis admission: heartbeat failed: %s", error)
                failing = True
        except Exception:
            log.exception("redis admission: heartbeat error")


async def flush_pending(gate: LedgerCore) -> None:
    """Retry what failed while Redis was down: releases/cancels, then stale purges."""
    for token, (up, owner) in list(gate._pending.items()):
        if owner == gate._owner:
            await gate._call(up, "cancel", owner, token, "cancel")
        gate._pending.pop(token, None)  # a fenced owner's entries go with its purge
    for owner in list(gate._stale_owners):
        await gate._pipeline("purge", owner)
        gate._stale_owners.discard(owner)


async def listen_loop(gate: LedgerCore) -> None:
    channels = [up.args[1] for up in gate._capped]
    while not gate._closed:
        pubsub = gate._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(*channels)
            gate._subscribed.set()
            for ticket in list(gate._tickets.values()):
                ticket._nudge()  # grants published while we were away were lost
            while not gate._closed:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message.get("type") == "message":
                    dispatch(gate, message)
        except REDIS_DOWN as error:
            gate._subscribed.clear()
            log.warning("redis admission: pub/sub failed (%s); resubscribing", error)
            await asyncio.sleep(_RETRY_SECONDS)
        except Exception:
            gate._subscribed.clear()
            log.exception("redis admission: pub/sub listener error")
            await asyncio.sleep(_RETRY_SECONDS)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]


def dispatch(gate: LedgerCore, message: dict[str, Any]) -> None:
    """Hand each promoted token of THIS process to its waiter (others' are skipped); a
    grant reads "<token>" or "<token>|<replica>"."""
    data = message.get("data")
    if not isinstance(data, str):
        return
    mine = gate._tag + "."
    for grant in data.split():
        if not grant.startswith(mine):
            continue
        token, _, replica = grant.partition("|")
        ticket = gate._tickets.get(token)
        if ticket is not None:
            ticket._grant(replica or None)
        else:  # the enter reply has not been processed yet: remember the grant
            early = gate._early
            early[token] = replica
            while len(early) > _EARLY_LIMIT:
                early.popitem(last=False)


async def read_oldest(gate: LedgerCore) -> None:
    """Each capped upstream's longest waiter (the queue deadline ZSET's first score, minus
    the timeout), on this process's clock, for the snapshot's oldest wait (status page)."""
    async with gate._redis.pipeline(transaction=False) as pipe:
        for up in gate._capped:
            pipe.zrange(up.deadlines, 0, 0, withscores=True)
        replies = await pipe.execute()
    now = gate._clock.now()
    for up, first in zip(gate._capped, replies, strict=True):
        if not first or up.policy is None:
            up.oldest = None
            continue
        arrived_ms = float(first[0][1]) - up.policy.queue_timeout_seconds * 1000
        up.oldest = now - max(0.0, up.stamp / 1000 - arrived_ms) / 1000  # stamp: the maintain reply's server time


async def refresh_loop(gate: LedgerCore) -> None:
    while not gate._closed:
        try:
            await gate._pipeline("maintain", gate._owner)
            await read_oldest(gate)
            gate.health.reachable = True
        except REDIS_DOWN as error:
            gate.health.reachable = False
            log.debug("redis admission: refresh failed: %s", error)
        except Exception:
            log.exception("redis admission: refresh error")
        await asyncio.sleep(gate._refresh)

