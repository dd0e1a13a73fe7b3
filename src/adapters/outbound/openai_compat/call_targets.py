"""Where an upstream call goes: the upstream's own session and URL, or, with `[endpoints]`,
the session and URL of the replica its admission chose (`ReplicaSessions`)."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from yarl import URL

from .replica_sessions import ReplicaSessions

_MAX_REPLICA_URLS = 1024  # replicas come and go with DNS: the URL cache stays bounded


class CallTargets:
    """The targets of one upstream's calls; a replica's session is held from `acquire` to `release`."""

    __slots__ = ("_name", "_replica_urls", "_replicas", "_sessions")

    def __init__(self, sessions: Mapping[str, aiohttp.ClientSession], name: str, replicas: ReplicaSessions) -> None:
        self._sessions = sessions  # this upstream's is `sessions[name]`, open while the app runs
        self._name = name
        self._replicas = replicas  # [endpoints]: a session per replica
        self._replica_urls: dict[tuple[str, str], URL] = {}  # (replica base URL, path) -> its URL

    def acquire(self, replica: str | None, path: str, default: URL) -> tuple[aiohttp.ClientSession, URL]:
        """The session and URL of this call: the upstream's (`default`), or the chosen replica's.

        A replica's session is acquired here: the caller releases it when the call is over.
        """
        if replica is None:
            return self._sessions[self._name], default
        url = self._replica_urls.get((replica, path))
        if url is None:
            if len(self._replica_urls) >= _MAX_REPLICA_URLS:
                self._replica_urls.clear()
            url = self._replica_urls[replica, path] = URL(replica.rstrip("/") + path)
        return self._replicas.acquire(replica), url

    def release(self, replica: str) -> None:
        """The call on `replica` is over: its session may close once the replica has left."""
        self._replicas.release(replica)
