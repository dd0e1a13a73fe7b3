"""A real DNS server on loopback (dnslib, in a thread) whose A/AAAA answers a test changes at runtime.

    with DnsServer({"replicas.test": ["127.0.0.2", "127.0.0.3"]}) as dns:
        dns.port                       # the UDP port it answers on, at 127.0.0.1
        dns.set("replicas.test", [])   # an empty answer from now on (NOERROR, no record)
        dns.failing = True             # SERVFAIL from now on
        dns.stop()                     # no answer at all (queries time out)

A name it does not know gets NXDOMAIN. Every answer has TTL 0.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class _Records(BaseResolver):  # type: ignore[misc]
    def __init__(self, records: Mapping[str, Iterable[str]]) -> None:
        self.lock = threading.Lock()
        self.records = {_key(name): list(addresses) for name, addresses in records.items()}
        self.failing = False
        self.queries = 0

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        with self.lock:
            self.queries += 1
            if self.failing:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            addresses = self.records.get(_key(str(request.q.qname)))
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for address in addresses:
            v6 = ipaddress.ip_address(address).version == 6
            if request.q.qtype == (QTYPE.AAAA if v6 else QTYPE.A):
                rdata = AAAA(address) if v6 else A(address)
                reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=rdata, ttl=0))
        return reply


def _key(name: str) -> str:
    return name.rstrip(".").lower()


class DnsServer:
    def __init__(self, records: Mapping[str, Iterable[str]]) -> None:
        self._records = _Records(records)
        quiet = DNSLogger("-request,-reply,-truncated,-error,-recv,-send,-data")
        self._server = DNSServer(self._records, address="127.0.0.1", port=0, logger=quiet)
        self.port: int = self._server.server.server_address[1]
        self._stopped = False

    def __enter__(self) -> DnsServer:
        self._server.start_thread()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def queries(self) -> int:
        return self._records.queries

    @property
    def failing(self) -> bool:
        return self._records.failing

    @failing.setter
    def failing(self, value: bool) -> None:
        with self._records.lock:
            self._records.failing = value

    def set(self, name: str, addresses: Iterable[str]) -> None:
        with self._records.lock:
            self._records.records[_key(name)] = list(addresses)

    def stop(self) -> None:
        """Stop answering and free the port: from now on queries get no answer."""
        if not self._stopped:
            self._stopped = True
            self._server.stop()
            self._server.server.server_close()
