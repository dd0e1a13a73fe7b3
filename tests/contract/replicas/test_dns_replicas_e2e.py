"""DNS discovery end to end: a real DNS server on loopback (dnslib) answering A records
for stub replicas on 127.0.0.2 / 127.0.0.3 / 127.0.0.4 (one port), a real gateway with
`[endpoints] dns`, clients on loopback. One scenario, in order: both replicas get traffic; a new
record gets requests (and the queued ones) within refresh_seconds + 1 s; a record that leaves
gets no new request while its requests in flight finish with 200; an empty answer makes
requests wait, then 503 + Retry-After, and `/readyz` names the upstream but stays ready;
records that return serve again; a DNS server that stops leaves the last set serving."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from tests.contract.admission.e2e_support import Reply, call, http_client, until
from tests.support.dns_server import DnsServer
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.replicas import endpoints_toml, port_free_on, stub_lines

NAME = "reasoning-predictor-headless.llm-serving.svc.cluster.local"
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
REFRESH = 0.5
HOLD = 2.0
# Two slots per replica under a cap of 6: two replicas hold 4, the third brings the live cap to 6.
ADMISSION = {"sequence_slots": 8, "max_in_flight": 6, "queue_depth": 8, "queue_timeout_seconds": 3}


async def states(c: httpx.AsyncClient, gw: Proc) -> dict[str, float]:
    page = samples((await c.get(gw.ops_url + "/metrics")).text)
    return {labels["state"]: v for name, labels, v in page if name == "gateway_upstream_endpoints"}


def counts(logs: dict[str, Path]) -> dict[str, int]:
    return {host: len(stub_lines(log)) for host, log in logs.items()}


async def test_dns_records_are_the_replicas_as_they_come_and_go(procs: Processes, tmp_path: Path) -> None:
    port = port_free_on(HOSTS)
    logs = {host: tmp_path / f"{host}.log" for host in HOSTS}
    for host in HOSTS:
        procs.stub("--max-num-seqs", "4", "--hold", str(HOLD), log=logs[host], port=port, host=host)
    with DnsServer({NAME: HOSTS[:2]}) as dns:
        toml = upstream_toml("reasoning", "http://127.0.0.1:9", ["reasoning"], ADMISSION) + endpoints_toml(
            "reasoning", dns=NAME, port=port, nameservers=[dns.nameserver], refresh=REFRESH, slots=4, cap=2)
        gw = procs.gateway(toml)
        async with http_client() as c:
            assert await states(c, gw) == {"ready": 2.0, "draining": 0.0, "ejected": 0.0}

            # Both replicas get traffic; 4 slots are all two replicas hold, so 2 of 6 wait.
            first = [asyncio.create_task(call(c, gw, "v1" if i % 2 else "llm", "reasoning")) for i in range(6)]
            await until(lambda: sum(counts(logs).values()) == 4, "4 requests reached the replicas")
            assert counts(logs) == {HOSTS[0]: 2, HOSTS[1]: 2, HOSTS[2]: 0}

            # A new record: its replica gets the queued requests within refresh_seconds + 1 s.
            added = time.monotonic()
            dns.set(NAME, HOSTS)
            await until(lambda: counts(logs)[HOSTS[2]] == 2, "the new replica took the queued two",
                        timeout=REFRESH + 1)
            assert time.monotonic() - added <= REFRESH + 1
            assert [r.status for r in await asyncio.gather(*first)] == [200] * 6

            # A record leaves while its replica has requests in flight: they finish with 200, and
            # it gets no new request.
            second = [asyncio.create_task(call(c, gw, "v1", "reasoning", stream=i % 2 == 0)) for i in range(6)]
            await until(lambda: sum(counts(logs).values()) == 12, "6 more in flight on the three")
            before = counts(logs)[HOSTS[0]]
            dns.set(NAME, HOSTS[1:])
            await until(lambda: _draining(c, gw), "127.0.0.2 is draining", timeout=REFRESH + 1)
            later = [asyncio.create_task(call(c, gw, "llm", "reasoning")) for _ in range(4)]
            replies = await asyncio.gather(*second, *later)
            assert [r.status for r in replies] == [200] * 10
            assert counts(logs)[HOSTS[0]] == before
            await until(lambda: _states_are(c, gw, {"ready": 2.0, "draining": 0.0, "ejected": 0.0}),
                        "the drained one is forgotten")

            # An empty answer: no ready replica; requests wait, then 503 + Retry-After; /readyz
            # names the upstream and stays ready.
            dns.set(NAME, [])
            await until(lambda: _states_are(c, gw, {"ready": 0.0, "draining": 0.0, "ejected": 0.0}), "no replica",
                        timeout=REFRESH + 1)
            ready = await c.get(gw.ops_url + "/readyz")
            assert ready.status_code == 200 and "upstream reasoning: no ready replica" in ready.text
            waited: Reply = await call(c, gw, "v1", "reasoning")
            assert waited.status == 503 and waited.headers.get("retry-after"), waited.text
            assert waited.elapsed >= ADMISSION["queue_timeout_seconds"] - 0.2

            # Recovery: a request waiting when the records return is served.
            pending = asyncio.create_task(call(c, gw, "llm", "reasoning"))
            await asyncio.sleep(0.3)
            dns.set(NAME, HOSTS[1:])
            recovered = await pending
            assert recovered.status == 200, recovered.text
            assert (await c.get(gw.ops_url + "/readyz")).text == "ready\n"

            # The DNS server stops: the last set keeps serving.
            dns.stop()
            await asyncio.sleep(3 * REFRESH)
            served = before_stop = counts(logs)
            replies = await asyncio.gather(*(call(c, gw, "v1", "reasoning") for _ in range(4)))
            assert [r.status for r in replies] == [200] * 4
            served = counts(logs)
            assert served[HOSTS[0]] == before_stop[HOSTS[0]]
            assert served[HOSTS[1]] + served[HOSTS[2]] == before_stop[HOSTS[1]] + before_stop[HOSTS[2]] + 4
    assert "DNS look-up of" in gw.text() and gw.text().count("failed") >= 1
    for host in HOSTS:
        assert max(line.waiting for line in stub_lines(logs[host])) == 0


async def _states_are(c: httpx.AsyncClient, gw: Proc, wanted: dict[str, float]) -> bool:
    return await states(c, gw) == wanted


async def _draining(c: httpx.AsyncClient, gw: Proc) -> bool:
    return (await states(c, gw)).get("draining") == 1.0
