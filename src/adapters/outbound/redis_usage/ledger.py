"""`RedisUsageLedger`: one consumer's request and token limits for every process at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.commands.core import AsyncScript

from adapters.outbound.memory_usage import UNLIMITED, UnlimitedReservation
from adapters.outbound.redis_gate.connection import REDIS_DOWN, RedisTarget, connect, prepare
from adapters.outbound.redis_usage import scripts
from adapters.outbound.redis_usage.tasks import Detached
from domain.consumers import EMPTY_SNAPSHOT, Consumer, ConsumerLimits, LimitKind, RateSnapshot
from domain.errors import AdmissionUnavailable, RateLimited
from domain.rate_limits import ConsumerUsage, Receipt, Refusal, effective_limits, to_ms

log = logging.getLogger("gateway.consumers.redis")
# A script refused, yet its reply's state admits (never expected): still a refusal, for 1 s.
_REQUESTS_RACE = Refusal(limit=LimitKind.REQUESTS_PER_MINUTE, wait_ms=1000)
_TOKENS_RACE = Refusal(limit=LimitKind.TOKENS_PER_MINUTE, wait_ms=1000)


def _arg(limit: int | None) -> int | str:
    return "" if limit is None else limit


class RedisReservation:
    __slots__ = ("_ledger", "_limits", "_name", "_receipt", "_settled", "snapshot")

    def __init__(self, ledger: RedisUsageLedger, name: str, limits: ConsumerLimits, receipt: Receipt) -> None:
        self._ledger, self._name, self._limits, self._receipt = ledger, name, limits, receipt
        self._settled = False
        self.snapshot = receipt.snapshot

    async def settle(self, tokens_used: int) -> None:
        """Never raises: with Redis unreachable the estimate stays charged (logged)."""
        if not self._settled:
            self._settled = True
            await self._ledger._settle(self._name, self._limits, self._receipt, tokens_used)


class RedisUsageLedger:
    """`ports.consumers.UsageLedger` on Redis: N processes enforce ONE set of limits.

    One script call per `take_request`, `reserve_tokens` and `settle`, each only for a consumer
    with such a limit: unlimited consumers never touch Redis.
    `wall_time` None (the gateway) takes the time from Redis `TIME`, so the replicas share
    one clock; tests pass a fake clock (wall-clock seconds) to reach windows and midnights.
    """

    def __init__(self, redis_url: str | RedisTarget, key_prefix: str = "gateway", *, socket_timeout: float = 2.0,
                 wall_time: Callable[[], float] | None = None) -> None:
        self._redis = connect(redis_url, socket_timeout)
        self._take_request = self._redis.register_script(scripts.TAKE_REQUEST)
        self._reserve_tokens = self._redis.register_script(scripts.RESERVE_TOKENS)
        self._settle_script = self._redis.register_script(scripts.SETTLE)
        self._prefix = key_prefix
        self._wall_time = wall_time
        self._tasks = Detached()

    async def start(self) -> None:
        """Scripts are loaded on first use (and again after a restart); a cluster client learns
        its slot map here. Never fails for Redis."""
        try:
            await prepare(self._redis)
        except REDIS_DOWN as error:
            log.warning("consumer counters: Redis unreachable at start (%s)", error)

    async def close(self) -> None:
        await self._tasks.wait(2.0)  # settles still on their way to Redis
        await self._redis.aclose()

    async def take_request(self, consumer: Consumer) -> RateSnapshot:
        limits = consumer.limits
        if limits.requests_per_minute is None:
            return EMPTY_SNAPSHOT
        # A hang-up mid-call leaves the request counted if the script ran: it was one.
        admitted, usage, now_ms = await self._call(self._take_request, consumer, self._args(limits), None)
        if admitted:
            return usage.snapshot(limits, now_ms)
        refused = usage.request_refusal(limits, now_ms) or _REQUESTS_RACE
        raise RateLimited(refused.limit, refused.retry_after, usage.snapshot(limits, now_ms))

    async def reserve_tokens(self, consumer: Consumer, tokens: int) -> UnlimitedReservation | RedisReservation:
        limits = consumer.limits
        if not limits.token_limited:
            return UNLIMITED
        tokens = max(0, tokens)
        args = self._args(limits)
        args.append(tokens)
        undo = partial(self._undo, consumer.name, limits, tokens)  # hung up mid-call: give the tokens back
        admitted, usage, now_ms = await self._call(self._reserve_tokens, consumer, args, undo)
        if admitted:
            return RedisReservation(self, consumer.name, limits, usage.receipt(limits, tokens, now_ms))
        refused = usage.token_refusal(limits, tokens, now_ms) or _TOKENS_RACE
        raise RateLimited(refused.limit, refused.retry_after, usage.snapshot(limits, now_ms))

    async def _call(self, script: AsyncScript, consumer: Consumer, args: list[int | str],
                    undo: Callable[[asyncio.Task[Any]], None] | None) -> tuple[bool, ConsumerUsage, int]:
        """One rate script for `consumer`: (admitted, the state it replied, its time in ms)."""
        call = self._tasks.spawn(script(keys=[scripts.rate_key(self._prefix, consumer.name)], args=args))
        try:
            reply = await asyncio.shield(call)
        except asyncio.CancelledError:
            if undo is not None:
                call.add_done_callback(undo)
            raise
        except REDIS_DOWN as error:
            log.warning("consumer counters: reserve for %s failed: %s", consumer.name, error)
            raise AdmissionUnavailable(1) from error
        return self._state(consumer.limits, reply)

    # -- internals ---------------------------------------------------------------------

    def _args(self, limits: ConsumerLimits) -> list[int | str]:
        now: int | str = "" if self._wall_time is None else to_ms(self._wall_time())
        return [now, *map(_arg, effective_limits(limits))]

    @staticmethod
    def _state(limits: ConsumerLimits, reply: list[Any]) -> tuple[bool, ConsumerUsage, int]:
        code, now_ms, requests, tokens, day, used = (int(x) for x in reply)
        rpm, tpm, _ = effective_limits(limits)
        usage = ConsumerUsage(requests=None if rpm is None else requests, tokens=None if tpm is None else tokens,
                              stamp=now_ms, day=day, used=used)
        return code == 1, usage, now_ms

    async def _settle(self, name: str, limits: ConsumerLimits, receipt: Receipt, tokens_used: int) -> None:
        args = self._args(limits)
        args += [receipt.tokens, max(0, tokens_used), 1 if receipt.bucket else 0, receipt.day]
        call = self._tasks.spawn(self._settle_script(keys=[scripts.rate_key(self._prefix, name)], args=args))
        try:
            await asyncio.shield(call)  # a cancelled caller (a `finally` of a hang-up) cannot stop it
        except REDIS_DOWN as error:
            log.warning("consumer counters: settle for %s failed, the estimate stays charged: %s",
                        name, error)

    def _undo(self, name: str, limits: ConsumerLimits, tokens: int, done: asyncio.Task[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            return  # nothing reserved (or unknown: the estimate may stay charged)
        admitted, usage, now_ms = self._state(limits, done.result())
        if admitted:
            receipt = usage.receipt(limits, tokens, now_ms)
            self._tasks.spawn(RedisReservation(self, name, limits, receipt).settle(0))


