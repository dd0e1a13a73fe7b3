"""One aiohttp `ClientSession` per replica address of one upstream (`[endpoints]`).

A replica's session is opened on its first call (inside the serving loop, as aiohttp
requires) and closed once the replica has left discovery and no call of this process
still uses it: a draining replica's requests in flight keep their connections to the
end, and a replica that comes back simply gets a new session. The sessions are made
like the upstream's own (`session.upstream_session`), so timeouts, TLS and the one
resend behave the same on every replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from .session import upstream_session


class ReplicaSessions:
    __slots__ = ("_closing", "_factory", "_ready", "_sessions", "_users")

    def __init__(self, factory: Callable[[str], aiohttp.ClientSession] = upstream_session) -> None:
        self._factory = factory
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._users: dict[str, int] = {}  # replica -> calls using its session now
        self._ready: frozenset[str] | None = None  # None: discovery has not spoken, keep all
        self._closing: set[asyncio.Task[None]] = set()

    def acquire(self, replica: str) -> aiohttp.ClientSession:
        """The replica's session, opened if needed; pair with `release` when the call is over."""
        session = self._sessions.get(replica)
        if session is None or session.closed:
            session = self._sessions[replica] = self._factory(replica)
        self._users[replica] = self._users.get(replica, 0) + 1
        return session

    def release(self, replica: str) -> None:
        left = self._users[replica] - 1
        if left:
            self._users[replica] = left
            return
        del self._users[replica]
        if self._ready is not None and replica not in self._ready:
            self._retire(replica)

    def retain(self, ready: frozenset[str]) -> None:
        """A new discovery answer: sessions of replicas outside it close once unused."""
        self._ready = ready
        for replica in [r for r in self._sessions if r not in ready and r not in self._users]:
            self._retire(replica)

    def __contains__(self, replica: str) -> bool:
        return replica in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def _retire(self, replica: str) -> None:
        session = self._sessions.pop(replica, None)
        if session is not None:
            task = asyncio.get_running_loop().create_task(session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """At shutdown: every session, and those still closing."""
        sessions = list(self._sessions.values())
        self._sessions.clear()
        self._users.clear()
        await asyncio.gather(*(s.close() for s in sessions), *self._closing, return_exceptions=True)
