"""Replicas end to end: `[endpoints]` TOML, the stubs' `--log` lines, and a poller of what every
replica holds (its own vLLM gauges, `GET /metrics` with `--max-num-seqs`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.metrics import samples

_FIELD = re.compile(r"(\w+)=(\S+)")


def endpoints_toml(upstream: str, *, urls: Sequence[str] | None = None, dns: str | None = None,
                   port: int | None = None, nameservers: Sequence[str] = (), refresh: float | None = None,
                   slots: int = 4, cap: int = 4) -> str:
    """An `[upstreams.NAME.endpoints]` table: fixed `urls`, or `dns` (+ port, nameservers, refresh)."""
    text = f"\n[upstreams.{upstream}.endpoints]\nsequence_slots = {slots}\nmax_in_flight = {cap}\n"
    if urls is not None:
        text += "urls = [" + ", ".join(f'"{u}"' for u in urls) + "]\n"
    if dns is not None:
        text += f'dns = "{dns}"\nport = {port}\n'
        text += "nameservers = [" + ", ".join(f'"{n}"' for n in nameservers) + "]\n"
        if refresh is not None:
            text += f"refresh_seconds = {refresh}\n"
    return text


@dataclass(frozen=True)
class StubLine:
    """One `chat start` line of a stub's `--log` (with `--max-num-seqs`)."""

    at: float
    in_flight: int
    max_concurrent: int
    waiting: int


def stub_lines(log: Path) -> list[StubLine]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        if " chat start " not in line:
            continue
        fields = dict(_FIELD.findall(line))
        out.append(StubLine(float(line.split()[0]), int(fields["in_flight"]), int(fields["max_concurrent"]),
                            int(fields.get("waiting", "0"))))
    return out


def port_free_on(hosts: Sequence[str]) -> int:
    """A TCP port free on every one of `hosts` (loopback addresses), for replicas on one port."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on all of {hosts}")


@dataclass
class Held:
    """What the replicas held, polled from their own gauges (running + waiting) while a load ran."""

    peak_each: dict[str, int] = field(default_factory=dict)
    peak_sum: int = 0
    polls: int = 0


async def _held(client: httpx.AsyncClient, url: str) -> int:
    text = (await client.get(url + "/metrics")).text
    return int(sum(v for name, _, v in samples(text) if name in ("vllm:num_requests_running",
                                                                   "vllm:num_requests_waiting")))


@contextlib.asynccontextmanager
async def polling(replicas: Sequence[str], every: float = 0.02, limit: float = 120.0) -> AsyncIterator[Held]:
    """Poll every replica's gauges until the block ends (at most `limit` seconds)."""
    held = Held(peak_each=dict.fromkeys(replicas, 0))

    async def run(client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            now = await asyncio.gather(*(_held(client, url) for url in replicas))
            held.polls += 1
            held.peak_sum = max(held.peak_sum, sum(now))
            for url, n in zip(replicas, now, strict=True):
                held.peak_each[url] = max(held.peak_each[url], n)
            await asyncio.sleep(every)

    async with httpx.AsyncClient(timeout=5.0) as client:
        task = asyncio.create_task(run(client))
        try:
            yield held
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
