"""`[endpoints] dns`: each A/AAAA record of a name is one replica, re-resolved every `refresh_seconds`.

A Kubernetes headless Service (`clusterIP: None`) answers with the ready pods' addresses,
so readiness is Kubernetes'. The look-ups use dnspython's asyncio resolver (never the
blocking `getaddrinfo`), in one background task per upstream: never per request.

- An answer, possibly empty (NXDOMAIN or no record: no replica is ready), replaces the
  set; a change is logged with what joined and what left.
- A failure (timeout, SERVFAIL, refused, unreachable nameserver) keeps the last good
  set; it is logged once per streak of failures, and the recovery once.
- Each look-up is bounded by `min(refresh_seconds, 5 s)`; A and AAAA are asked at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Sequence

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from ports.discovery import ReadyListener

log = logging.getLogger("gateway.discovery")
LOOKUP_TIMEOUT = 5.0  # seconds, at most, for one look-up (A and AAAA together)
_EMPTY = (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer)  # the name has no such record: an answer


class DnsReplicas:
    """The replicas of one upstream from DNS: `scheme://ADDRESS:port` per record."""

    __slots__ = ("_failing", "_listener", "_name", "_port", "_ready", "_refresh", "_resolver", "_scheme",
                 "_task", "_timeout", "upstream")  # fmt: skip

    def __init__(
        self, upstream: str, name: str, port: int, *, scheme: str = "http", refresh_seconds: float = 5.0,
        nameservers: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.upstream = upstream
        self._name, self._port, self._scheme = name, port, scheme
        self._refresh = refresh_seconds
        self._timeout = min(LOOKUP_TIMEOUT, refresh_seconds)
        self._ready: frozenset[str] = frozenset()
        self._failing = False
        self._listener: ReadyListener | None = None
        self._task: asyncio.Task[None] | None = None
        self._resolver = dns.asyncresolver.Resolver(configure=not nameservers)
        if nameservers:
            self._resolver.nameservers = [dns.nameserver.Do53Nameserver(host, port) for host, port in nameservers]

    def ready(self) -> frozenset[str]:
        return self._ready

    async def start(self, listener: ReadyListener) -> None:
        self._listener = listener
        await self.refresh()
        listener(self._ready)  # the first answer, even an empty one
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"dns {self.upstream}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh)
            await self.refresh()

    async def refresh(self) -> None:
        """One look-up; a new answer replaces the set (and is told), a failure keeps it."""
        try:
            async with asyncio.timeout(self._timeout):
                found = await asyncio.gather(self._records("A"), self._records("AAAA"))
        except (dns.exception.DNSException, OSError, TimeoutError) as exc:
            if not self._failing:
                self._failing = True
                log.warning("upstream %s: DNS look-up of %s failed (%s); keeping the last %d replica(s) until it "
                            "answers again", self.upstream, self._name, _describe(exc), len(self._ready))  # fmt: skip
            return
        if self._failing:
            self._failing = False
            log.info("upstream %s: DNS look-up of %s answers again", self.upstream, self._name)
        ready = frozenset(self._url(address) for addresses in found for address in addresses)
        if ready == self._ready:
            return
        joined, left = sorted(ready - self._ready), sorted(self._ready - ready)
        self._ready = ready
        log.info("upstream %s: %d replica(s) from %s%s%s", self.upstream, len(ready), self._name,
                 f"; joined {', '.join(joined)}" if joined else "",
                 f"; left {', '.join(left)}" if left else "")  # fmt: skip
        if self._listener is not None and self._task is not None:  # start() tells the first answer itself
            self._listener(ready)

    async def _records(self, kind: str) -> list[str]:
        try:
            answer = await self._resolver.resolve(self._name, kind, search=True, lifetime=self._timeout)
        except _EMPTY:
            return []
        return [record.to_text() for record in answer]

    def _url(self, address: str) -> str:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
        return f"{self._scheme}://{host}:{self._port}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | dns.exception.Timeout):
        return "timed out"
    return str(exc) or type(exc).__name__
