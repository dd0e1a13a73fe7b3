"""A small HTTP/1.1 keep-alive load generator (asyncio + httptools), bounded in time.

Used by the harness for two things wrk cannot do or may be missing for:
- the time-to-first-token probe: one extra client measuring, per streamed answer, the time
  from sending the request to the first body bytes that carry generated text
  (`"content":"x` in OpenAI chunks, `"text":"x` in Anthropic `text_delta`s);
- a fallback driver when wrk is not installed (the CI smoke).

    python bench/loadgen.py --url http://127.0.0.1:8080/v1/chat/completions \
        --body '{"model":"bench","messages":[...]}' --concurrency 4 --duration 2

Prints one JSON object: requests, ok, errors, seconds, rps, p50_ms, p99_ms, ttft_p50_ms, ...
Loopback only: the URL must point at 127.0.0.1 / localhost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import cast
from urllib.parse import urlsplit

import httptools

# The first bytes of generated text in an OpenAI chunk or an Anthropic text_delta (an empty
# string, as in the role chunk or content_block_start, does not count).
TOKEN = re.compile(rb'"(?:content|text)":\s*"[^"]')


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


class Stats:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.ok = 0
        self.errors = 0
        self.connect_errors = 0


class Client(asyncio.Protocol):
    """One keep-alive connection sending the same request again until the deadline."""

    def __init__(self, request: bytes, stats: Stats, deadline: float, done: asyncio.Future[None],
                 budget: list[int]) -> None:
        self.request, self.stats, self.deadline, self.done = request, stats, deadline, done
        self.budget = budget  # [requests left to send], shared by every connection; < 0: no count
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sent = 0.0
        self.ttft: float | None = None
        self.tail = b""
        self.closed_here = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        if self.budget[0] == 0:
            self.close()
            return
        self.budget[0] -= 1
        self.ttft, self.tail = None, b""
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.stats.errors += 1
            self.close()

    def on_body(self, body: bytes) -> None:
        if self.ttft is None:
            window = self.tail + body
            if TOKEN.search(window):
                self.ttft = time.perf_counter() - self.sent
            self.tail = window[-32:]

    def on_message_complete(self) -> None:
        now = time.perf_counter()
        if self.parser.get_status_code() == 200:
            self.stats.ok += 1
            self.stats.latencies.append(now - self.sent)
            if self.ttft is not None:
                self.stats.ttfts.append(self.ttft)
        else:
            self.stats.errors += 1
        if now < self.deadline and self.parser.should_keep_alive():
            self.send()
        else:
            self.close()

    def close(self) -> None:
        self.closed_here = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed_here:
            self.stats.errors += 1  # the server hung up in the middle of the run
        if not self.done.done():
            self.done.set_result(None)


async def run(url: str, body: bytes, headers: list[str], concurrency: int, duration: float,
              requests: int = -1) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("loadgen: loopback targets only")
    head = [f"POST {parts.path or '/'} HTTP/1.1", f"host: {host}:{port}", "content-type: application/json",
            f"content-length: {len(body)}", *headers]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    stats = Stats()
    start = time.perf_counter()
    deadline = start + duration
    dones: list[asyncio.Future[None]] = []
    budget = [requests]
    for _ in range(min(concurrency, requests) if requests >= 0 else concurrency):
        done: asyncio.Future[None] = loop.create_future()
        try:
            await loop.create_connection(lambda d=done: Client(request, stats, deadline, d, budget), host, port)
        except OSError:
            stats.connect_errors += 1
            continue
        dones.append(done)
    # Requests still in flight at the deadline get a grace period, then are dropped.
    await asyncio.wait(dones, timeout=duration + 10) if dones else None
    seconds = time.perf_counter() - start
    ms = 1000.0
    return {
        "driver": "loadgen",
        "requests": stats.ok + stats.errors,
        "ok": stats.ok,
        "errors": stats.errors + stats.connect_errors,
        "seconds": seconds,
        "rps": stats.ok / seconds if seconds else 0.0,
        "p50_ms": _scaled(percentile(stats.latencies, 50), ms),
        "p99_ms": _scaled(percentile(stats.latencies, 99), ms),
        "ttft_p50_ms": _scaled(percentile(stats.ttfts, 50), ms),
        "ttft_p99_ms": _scaled(percentile(stats.ttfts, 99), ms),
        "ttft_samples": len(stats.ttfts),
    }


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True, help="JSON request body")
    parser.add_argument("--header", action="append", default=[], help="extra 'name: value' header")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds (capped at 600)")
    parser.add_argument("--requests", type=int, default=-1,
                        help="send exactly this many requests in all (the run ends at the count or the duration)")
    args = parser.parse_args(argv)
    duration = min(max(args.duration, 0.05), 600.0)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        result = asyncio.run(run(args.url, args.body.encode(), args.header, args.concurrency, duration, args.requests))
    else:
        result = uvloop.run(run(args.url, args.body.encode(), args.header, args.concurrency, duration, args.requests))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
