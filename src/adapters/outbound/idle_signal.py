"""Waiting until a gate holds no lease (the drain's last step), shared by both gates."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class IdleSignal:
    """`wait` sleeps until the owner's `check` finds it idle; no polling."""

    __slots__ = ("_event", "_is_idle")

    def __init__(self, is_idle: Callable[[], bool]) -> None:
        self._is_idle = is_idle
        self._event: asyncio.Event | None = None

    async def wait(self, timeout: float) -> bool:
        """True once idle; False if `timeout` passes first."""
        if self._is_idle():
            return True
        if self._event is None:
            self._event = asyncio.Event()
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return self._is_idle()
        return True

    def check(self) -> None:
        """Call after every release: wakes the waiters once nothing is held."""
        event = self._event
        if event is not None and self._is_idle():
            self._event = None
            event.set()
