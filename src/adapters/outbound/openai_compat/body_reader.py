"""One response body's reads, every wait for more bounded by `idle_timeout`, with one timer.

An `asyncio.timeout` around each read costs an object, a timer and the task's cancel
machinery per read: per token of a stream. Instead each read only notes when it began,
and one loop timer per response fires once per `idle_timeout`: if a read is pending and
began at least `idle_timeout` ago, the response is closed (`ClientResponse.close()`),
which fails the pending read, reported as `UpstreamTimeout`; otherwise the timer is set
again for the pending read's deadline, or dropped until the next read while none is
pending (a consumer busy elsewhere is not an idle upstream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import aiohttp

from domain.errors import GatewayError, UpstreamError, UpstreamTimeout
from domain.upstream_failures import FailureKind

log = logging.getLogger("gateway.upstream")


class BodyReader:
    """Reads one response's body; `close()` when done with it (drops the timer)."""

    __slots__ = ("_handle", "_idle", "_loop", "_name", "_reading", "_resp", "_since", "expired")

    def __init__(self, resp: aiohttp.ClientResponse, idle: float, name: str) -> None:
        self._resp = resp
        self._idle = idle
        self._name = name  # the upstream's, for messages
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._reading = False
        self._since = 0.0
        self.expired = False

    def start(self) -> Awaitable[bytes]:
        """Begin a read: aiohttp's own awaitable of what arrives next (b"" at the body's end), with
        no coroutine of ours around it (a stream reads once per token). Call `done()` once it
        ended, however; an `aiohttp.ClientError` it raises becomes `failure(exc)`."""
        self._since = since = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(since + self._idle, self._check)
        self._reading = True
        return self._resp.content.readany()

    def done(self) -> None:
        self._reading = False

    def failure(self, exc: aiohttp.ClientError) -> GatewayError:
        """The domain error of a read that failed: the idle timeout's, or the connection's."""
        if self.expired:
            return UpstreamTimeout(
                f"upstream '{self._name}' sent nothing for {self._idle:g}s", failure=FailureKind.AFTER_HEAD
            )
        # e.g. "ContentLengthError ... ConnectionResetError(104, ...)": logged, never shown.
        log.warning("upstream %s connection failed mid-answer: %r", self._name, exc)
        return UpstreamError(f"upstream '{self._name}' connection failed mid-answer", failure=FailureKind.AFTER_HEAD)

    async def read(self) -> bytes:
        """What arrived of the body since the last read (b"" at its end); failures as domain errors."""
        try:
            return await self.start()
        except aiohttp.ClientError as exc:
            raise self.failure(exc) from exc
        finally:
            self._reading = False

    def _check(self) -> None:
        self._handle = None
        if not self._reading:
            return  # the next read sets the timer again
        due = self._since + self._idle
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.expired = True
        self._resp.close()  # fails the pending read (aiohttp: "Connection closed")

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
