"""DNS discovery against a real DNS server on loopback: answers replace the set, failures keep it,
an empty answer empties it, and the event loop never waits on a look-up."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from tests.support.dns_server import DnsServer

from adapters.outbound.replica_discovery import StaticReplicas
from adapters.outbound.replica_discovery.dns_records import DnsReplicas

NAME = "reasoning-predictor-headless.llm-serving.svc.cluster.local"
REFRESH = 0.3


def urls(*hosts: str, port: int = 8080) -> frozenset[str]:
    return frozenset(f"http://{host}:{port}" for host in hosts)


class Seen:
    def __init__(self) -> None:
        self.answers: list[frozenset[str]] = []

    def __call__(self, ready: frozenset[str]) -> None:
        self.answers.append(ready)

    async def until(self, ready: frozenset[str], within: float = REFRESH + 1) -> float:
        started = time.monotonic()
        while not self.answers or self.answers[-1] != ready:
            if time.monotonic() - started > within:
                raise AssertionError(f"not told {sorted(ready)} within {within} s: {self.answers}")
            await asyncio.sleep(0.02)
        return time.monotonic() - started


def discovery(dns: DnsServer, name: str = NAME, **kw: object) -> DnsReplicas:
    return DnsReplicas("reasoning", name, 8080, refresh_seconds=REFRESH, nameservers=[("127.0.0.1", dns.port)],
                       **kw)  # type: ignore[arg-type]  # fmt: skip


async def test_records_are_replicas_and_changes_arrive_within_the_refresh(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "gateway.discovery")
    with DnsServer({NAME: ["127.0.0.2", "127.0.0.3"]}) as dns:
        seen = Seen()
        replicas = discovery(dns)
        await replicas.start(seen)
        try:
            assert seen.answers == [urls("127.0.0.2", "127.0.0.3")] and replicas.ready() == seen.answers[0]
            dns.set(NAME, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
            await seen.until(urls("127.0.0.2", "127.0.0.3", "127.0.0.4"))
            dns.set(NAME, ["127.0.0.3", "127.0.0.4"])
            await seen.until(urls("127.0.0.3", "127.0.0.4"))
            queries = dns.queries
            await asyncio.sleep(3 * REFRESH)
            assert len(seen.answers) == 3  # an unchanged answer is not told again
            assert 2 * 2 <= dns.queries - queries <= 4 * 2  # A and AAAA once per refresh, never more
        finally:
            await replicas.close()
    assert "joined http://127.0.0.4:8080" in caplog.text and "left http://127.0.0.2:8080" in caplog.text


async def test_a_failing_or_stopped_server_keeps_the_last_set_and_logs_once_per_streak(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gateway.discovery")
    with DnsServer({NAME: ["127.0.0.2", "127.0.0.3"]}) as dns:
        seen = Seen()
        replicas = discovery(dns)
        await replicas.start(seen)
        try:
            dns.failing = True  # SERVFAIL
            await asyncio.sleep(4 * REFRESH)
            assert replicas.ready() == urls("127.0.0.2", "127.0.0.3") and len(seen.answers) == 1
            failures = [r for r in caplog.records if "failed" in r.getMessage()]
            assert len(failures) == 1 and failures[0].levelno == logging.WARNING
            dns.failing = False
            dns.set(NAME, ["127.0.0.2"])
            await seen.until(urls("127.0.0.2"))
            assert "answers again" in caplog.text
            dns.stop()  # no answer at all: every look-up times out
            await asyncio.sleep(4 * REFRESH)
            assert replicas.ready() == urls("127.0.0.2") and seen.answers[-1] == urls("127.0.0.2")
            assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 2  # one per streak
            assert "timed out" in caplog.records[-1].getMessage()
        finally:
            await replicas.close()


async def test_an_empty_answer_means_no_ready_replica_until_records_return() -> None:
    with DnsServer({NAME: ["127.0.0.2"]}) as dns:
        seen = Seen()
        replicas = discovery(dns)
        await replicas.start(seen)
        try:
            dns.set(NAME, [])  # NOERROR, no record
            await seen.until(frozenset())
            dns.set(NAME, ["127.0.0.3"])
            await seen.until(urls("127.0.0.3"))
        finally:
            await replicas.close()
        unknown = discovery(dns, "nothing.svc.cluster.local")  # NXDOMAIN: no replica either
        await unknown.start(seen)
        await unknown.close()
        assert seen.answers[-1] == frozenset()


async def test_ipv6_records_scheme_and_lookups_never_block_the_loop() -> None:
    with DnsServer({NAME: ["::1", "127.0.0.2"]}) as dns:
        seen = Seen()
        replicas = DnsReplicas("reasoning", NAME, 9443, scheme="https", refresh_seconds=REFRESH,
                               nameservers=[("127.0.0.1", dns.port)])  # fmt: skip
        await replicas.start(seen)
        try:
            assert seen.answers == [frozenset({"https://[::1]:9443", "https://127.0.0.2:9443"})]
            dns.stop()  # every look-up now waits for its whole timeout
            worst, last = 0.0, time.monotonic()
            for _ in range(int(4 * REFRESH / 0.01)):
                await asyncio.sleep(0.01)
                now = time.monotonic()
                worst, last = max(worst, now - last), now
            assert worst < 0.1  # the loop kept turning through the timed-out look-ups
        finally:
            await replicas.close()


async def test_static_urls_are_always_ready() -> None:
    seen = Seen()
    static = StaticReplicas(["http://10.0.0.1:8080", "http://10.0.0.2:8080"])
    await static.start(seen)
    assert seen.answers == [urls("10.0.0.1", "10.0.0.2")] == [static.ready()]
    await static.close()
