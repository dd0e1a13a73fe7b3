"""`RedisConsumerConcurrency`: `max_in_flight` per consumer across every process.

A slot is a member of the consumer's `held` sorted set whose score is its lease expiry;
this process renews the leases of its slots every lease/3, so the slots of a process that
died lapse within one lease and are dropped by the next script touching the key.

Waiting: each process keeps its waiters of a consumer in a local FIFO and only the head
asks Redis (one script call). It tries again when a release anywhere is published on the
`consumers:free` channel (one pub/sub connection per process), when a local slot is
released, or after `recheck_seconds` at the latest (a lapsed lease publishes nothing, and
a message sent while the listener was reconnecting is lost). Across processes the order
is not FIFO: whichever head asks first after a release gets the slot. `max_waiting` bounds
the waiters of a consumer per process: a request that gets no slot at its first try (or
finds others waiting) is refused when that many already wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from itertools import count
from typing import Any

from adapters.outbound.memory_usage import UNLIMITED_SLOT, UnlimitedSlot, too_many_waiting
from adapters.outbound.redis_gate.connection import REDIS_DOWN, RedisTarget, connect, prepare, run_scripts
from adapters.outbound.redis_usage import scripts
from adapters.outbound.redis_usage.tasks import Detached
from domain.consumers import Consumer
from domain.errors import AdmissionUnavailable, QueueTimeout

log = logging.getLogger("gateway.consumers.redis")
_RETRY_SECONDS = 0.5  # pause before resubscribing after a pub/sub failure


class _Waiter:
    """A place in a local FIFO; `wake` before `sleep` is remembered, never lost."""

    __slots__ = ("_fut", "waiting", "woken")

    def __init__(self) -> None:
        self._fut: asyncio.Future[None] | None = None
        self.woken = False
        self.waiting = False  # no slot at its first try (or not first in line): one of the waiters

    def wake(self) -> None:
        self.woken = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def sleep(self, seconds: float) -> None:
        if self.woken:
            return
        fut = self._fut = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(seconds):
                await fut
        except TimeoutError:
            pass
        finally:
            self._fut = None


class RedisSlot:
    __slots__ = ("_owner", "_released", "key", "name", "token")

    def __init__(self, owner: RedisConsumerConcurrency, key: str, name: str, token: str) -> None:
        self._owner, self.key, self.name, self.token = owner, key, name, token
        self._released = False

    async def release(self) -> None:
        """Idempotent, never raises for Redis: a failed release is retried, and the lease
        lapses anyway."""
        if not self._released:
            self._released = True
            await self._owner._release(self)


class RedisConsumerConcurrency:
    """`ports.consumers.ConsumerConcurrency` on Redis; `start`/`close` run its two loops."""

    def __init__(self, redis_url: str | RedisTarget, key_prefix: str = "gateway", lease_seconds: float = 10.0, *,
                 recheck_seconds: float = 0.5, socket_timeout: float = 2.0) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self._redis = connect(redis_url, socket_timeout)
        self._acquire = self._redis.register_script(scripts.ACQUIRE)
        self._release_script = self._redis.register_script(scripts.RELEASE)
        self._renew = self._redis.register_script(scripts.RENEW)
        self._prefix = key_prefix
        self._channel = f"{key_prefix}:{scripts.CHANNEL}"
        self._lease_ms = int(lease_seconds * 1000)
        self._recheck = recheck_seconds
        self._tag = secrets.token_hex(4)
        self._tokens = count(1)
        self._held: dict[str, RedisSlot] = {}  # token -> slot, held by this process
        self._queues: dict[str, deque[_Waiter]] = {}  # consumer -> local FIFO of waiters
        self._pending: dict[str, tuple[str, str]] = {}  # token -> (key, consumer): release to retry
        self._tasks = Detached()
        self._loops: list[asyncio.Task[None]] = []
        self._subscribed = asyncio.Event()
        self._closed = False
        self.lost = 0  # slots whose lease lapsed while held (a pause or outage > lease)

    async def start(self) -> None:
        """Start the lease renewal and the pub/sub listener; never fails for Redis."""
        if self._loops:
            return
        try:
            await prepare(self._redis)
        except REDIS_DOWN as error:
            log.warning("consumer slots: Redis unreachable at start (%s)", error)
        self._loops = [asyncio.create_task(self._renew_loop(), name="consumer-slots-renew"),
                       asyncio.create_task(self._listen_loop(), name="consumer-slots-listener")]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await self._subscribed.wait()

    async def close(self) -> None:
        """Stop the loops, give back the slots this process still holds, close Redis."""
        self._closed = True
        for task in self._loops:
            task.cancel()
        if self._loops:
            await asyncio.wait(self._loops, timeout=3.0)
        self._loops = []
        for slot in list(self._held.values()):
            await slot.release()
        await self._tasks.wait(2.0)
        await self._redis.aclose()

    async def acquire(self, consumer: Consumer, timeout: float, max_waiting: int) -> UnlimitedSlot | RedisSlot:
        cap = consumer.limits.max_in_flight
        if cap is None:
            return UNLIMITED_SLOT
        if self._closed:
            raise AdmissionUnavailable(1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        name = consumer.name
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = deque()
        waiter = _Waiter()
        queue.append(waiter)
        try:
            while True:
                if queue[0] is waiter:
                    waiter.woken = False
                    slot = await self._try(name, cap)
                    if slot is not None:
                        return slot
                if not waiter.waiting:  # it would wait: only if fewer than max_waiting do
                    if sum(w.waiting for w in queue) >= max_waiting:
                        raise too_many_waiting(max_waiting)
                    waiter.waiting = True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise QueueTimeout(1)
                await waiter.sleep(min(remaining, self._recheck))
        finally:
            queue.remove(waiter)
            if queue:
                queue[0].wake()  # the next in line asks at once: a slot may still be free
            elif self._queues.get(name) is queue:
                del self._queues[name]

    # -- internals ---------------------------------------------------------------------

    async def _try(self, name: str, cap: int) -> RedisSlot | None:
        key, token = scripts.held_key(self._prefix, name), f"{self._tag}.{next(self._tokens)}"
        call = self._tasks.spawn(self._acquire(keys=[key], args=["", cap, token, self._lease_ms]))
        try:
            granted, _ = await asyncio.shield(call)
        except asyncio.CancelledError:  # hung up mid-call: give back a slot granted meanwhile
            call.add_done_callback(lambda done: self._undo(key, name, token, done))
            raise
        except REDIS_DOWN as error:
            self._pending[token] = (key, name)  # the script may have run: release it later
            log.warning("consumer slots: acquire for %s failed: %s", name, error)
            raise AdmissionUnavailable(1) from error
        if not int(granted):
            return None
        slot = self._held[token] = RedisSlot(self, key, name, token)
        return slot

    def _undo(self, key: str, name: str, token: str, done: asyncio.Task[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            self._pending[token] = (key, name)
        elif int(done.result()[0]):
            self._tasks.spawn(self._release_token(key, name, token))

    async def _release(self, slot: RedisSlot) -> None:
        self._held.pop(slot.token, None)
        call = self._tasks.spawn(self._release_token(slot.key, slot.name, slot.token))
        await asyncio.shield(call)  # a cancelled caller (a `finally` of a hang-up) cannot stop it

    async def _release_token(self, key: str, name: str, token: str) -> None:
        try:
            await self._release_script(keys=[key], args=["", token, self._channel, name])
        except REDIS_DOWN as error:
            self._pending[token] = (key, name)
            log.warning("consumer slots: release for %s deferred: %s", name, error)
            return
        self._pending.pop(token, None)
        self._wake(name)  # our own waiters need not wait for the published message

    def _wake(self, name: str) -> None:
        queue = self._queues.get(name)
        if queue:
            queue[0].wake()

    async def _renew_loop(self) -> None:
        failing = False
        while not self._closed:
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                await self._renew_all()
                for token, (key, name) in list(self._pending.items()):
                    await self._release_script(keys=[key], args=["", token, self._channel, name])
                    self._pending.pop(token, None)
                if failing:
                    log.warning("consumer slots: Redis reachable again")
                    failing = False
            except REDIS_DOWN as error:
                if not failing:
                    log.warning("consumer slots: lease renewal failed: %s", error)
                    failing = True
            except Exception:
                log.exception("consumer slots: lease renewal error")

    async def _renew_all(self) -> None:
        by_key: dict[str, list[str]] = {}
        for token, slot in self._held.items():
            by_key.setdefault(slot.key, []).append(token)
        if not by_key:
            return
        replies = await run_scripts(
            self._redis, [(self._renew, [key], ["", self._lease_ms, *tokens]) for key, tokens in by_key.items()])
        missing = sum(int(reply[0]) for reply in replies)
        if missing:
            self.lost += missing
            log.error("consumer slots: %d slot leases lapsed while held (paused or cut off "
                      "from Redis for longer than the lease); max_in_flight may be exceeded", missing)

    async def _listen_loop(self) -> None:
        while not self._closed:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self._subscribed.set()
                for name in list(self._queues):
                    self._wake(name)  # releases published while we were away were lost
                while not self._closed:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        data = message.get("data")
                        if isinstance(data, str):
                            self._wake(data)
            except REDIS_DOWN as error:
                self._subscribed.clear()
                log.warning("consumer slots: pub/sub failed (%s); resubscribing", error)
                await asyncio.sleep(_RETRY_SECONDS)
            except Exception:
                self._subscribed.clear()
                log.exception("consumer slots: pub/sub listener error")
                await asyncio.sleep(_RETRY_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

