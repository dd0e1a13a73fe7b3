"""One response body's reads, every wait for more bounded by `idle_timeout`, with one timer.

An `asyncio.timeout` around each read costs an object, a timer and the task's cancel
machinery per read: per token of a stream. Instead each read only notes when it began,
and one loop timer per response fires once per `idle_timeout`: if a read is pending and
the body has been silent for at least `idle_timeout`, the response is closed
(`ClientResponse.close()`), which fails the pending read, reported as `UpstreamTimeout`;
otherwise the timer is set again for the pending read's deadline, or dropped until the
next read while none is pending (a consumer busy elsewhere is not an idle upstream).

A heartbeat (`heartbeat` seconds, for a dialect that pings a quiet stream) rides on the
same timer: a read pending that long is interrupted the way `asyncio.timeout` interrupts
a wait (the reading task is cancelled, and `beat()` takes that cancellation back), which
loses nothing (aiohttp keeps what arrives for the next read) and lets the consumer send
its keep-alive before reading again. The silence the idle timeout measures goes on
across heartbeats: only bytes end it.
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

    __slots__ = ("_beat_at", "_beating", "_handle", "_heartbeat", "_idle", "_loop", "_name", "_quiet", "_resp",
                 "_since", "_task", "expired", "reading")  # fmt: skip

    def __init__(self, resp: aiohttp.ClientResponse, idle: float, name: str, heartbeat: float | None = None) -> None:
        self._resp = resp
        self._idle = idle
        self._name = name  # the upstream's, for messages
        self._heartbeat = heartbeat
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self.reading = False
        self._since = 0.0  # when the pending read began, or the silence (`_quiet`) that it continues
        self._quiet = False  # the last read ended in a heartbeat: the body is still silent
        self._beat_at = 0.0  # when the pending read is due a heartbeat
        self._beating = False  # the timer cancelled the reading task for a heartbeat
        self._task: asyncio.Task[object] | None = None
        self.expired = False

    def start(self) -> Awaitable[bytes]:
        """Begin a read: aiohttp's own awaitable of what arrives next (b"" at the body's end), with
        no coroutine of ours around it (a stream reads once per token). Set `reading` False once
        it ended, however (an attribute, not a method: a call less per token); an
        `aiohttp.ClientError` it raises becomes `failure(exc)`, a `CancelledError` is first
        offered to `beat()`."""
        now = self._loop.time()
        if self._quiet:
            self._quiet = False
        else:
            self._since = now
        heartbeat = self._heartbeat
        if heartbeat is not None:
            self._beat_at = now + heartbeat
            # The loop passed: without it CPython 3.11 finds the running loop with a getpid() system call.
            self._task = asyncio.current_task(self._loop)
        if self._handle is None:
            due = self._since + self._idle
            self._handle = self._loop.call_at(due if heartbeat is None else min(due, self._beat_at), self._check)
        self.reading = True
        return self._resp.content.readany()

    def beat(self) -> bool:
        """After a read raised `CancelledError`: True when that was this reader's heartbeat and
        nothing else cancels the task (the cancellation is taken back; read again after the
        keep-alive), False for a cancellation to let through."""
        self.reading = False
        if not self._beating:
            return False
        self._beating = False
        task, self._task = self._task, None
        if task is None or task.uncancel():
            return False  # someone else cancels the task too: that one goes on
        self._quiet = True
        return True

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
            self.reading = False

    def _check(self) -> None:
        self._handle = None
        if not self.reading:
            return  # the next read sets the timer again
        due = self._since + self._idle
        now = self._loop.time()
        if now >= due:
            self.expired = True
            self._resp.close()  # fails the pending read (aiohttp: "Connection closed")
            return
        if self._heartbeat is not None:
            if now >= self._beat_at and not self._beating and self._task is not None:
                self._beating = True
                self._task.cancel()  # `beat()` takes it back where the read raises it
                return  # the next read sets the timer again
            due = min(due, self._beat_at)
        self._handle = self._loop.call_at(due, self._check)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
