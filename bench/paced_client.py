"""The paced scenario's client: N concurrent streams, each timing every arrival precisely.

One process (uvloop + httptools, no framework: the cheapest client this machine has) holds
`--streams` keep-alive connections; at `--start-at` (a time.time() value, so several
processes start together) each sends the streaming request, and again when its answer ends,
`--rounds` times. Per stream it records, at each read that completes at least one SSE event,
the perf_counter() of that read (an "arrival": events that come in one read are one arrival
to the client). It reports:

- completed: answers with status 200 that reached their terminal event
  (`data: [DONE]` or `message_stop`);
- ttft_ms: send -> first arrival carrying generated text;
- gaps_ms: the steady-state gaps, between consecutive arrivals from the first text arrival
  through the terminal one (so a late terminal event counts);
- lag_ms: its own event loop's lateness, sampled every 5 ms during the run, and cpu_s: its
  own CPU time: the evidence that the client, not the target, did not stall.

Prints one JSON object. Bounded: every connection stops at --timeout. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from typing import cast
from urllib.parse import urlsplit

import httptools

TOKEN = re.compile(rb'"(?:content|text)":\s*"[^"]')  # as bench/loadgen.py: an empty string is no token
TERMINAL = re.compile(rb"data: \[DONE\]|event: message_stop|\"type\":\s*\"message_stop\"")
LAG_TICK = 0.005


class Totals:
    def __init__(self) -> None:
        self.completed = self.errors = 0
        self.ttft: list[float] = []
        self.gaps: list[float] = []


class Stream(asyncio.Protocol):
    """One keep-alive connection running `rounds` streams one after the other."""

    def __init__(self, request: bytes, rounds: int, totals: Totals, done: asyncio.Future[None]) -> None:
        self.request, self.rounds, self.totals, self.done = request, rounds, totals, done
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.now = 0.0
        self._reset()

    def _reset(self) -> None:
        self.sent = 0.0
        self.arrivals: list[float] = []  # from the first text arrival on
        self.tail = b""
        self.terminal = False
        self.ended_here = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def send(self) -> None:
        assert self.transport is not None
        self._reset()
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()  # one clock read per read: every event in it arrived now
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.totals.errors += 1
            self.close()

    def on_body(self, body: bytes) -> None:
        window, seen = self.tail + body, len(self.tail)
        self.tail = window[-40:]
        # An event ends in this read if its blank line ends in `body` (it may start in the tail).
        ended = window.find(b"\n\n", max(0, seen - 1)) >= 0 or window.find(b"\r\n\r\n", max(0, seen - 3)) >= 0
        if self.terminal or not ended:
            return  # no event completed in this read (or after the end): nothing arrived yet
        if self.arrivals:
            if self.arrivals[-1] != self.now:
                self.arrivals.append(self.now)
        elif TOKEN.search(window):
            self.arrivals.append(self.now)
            self.totals.ttft.append(self.now - self.sent)
        if TERMINAL.search(window):
            self.terminal = True

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() == 200 and self.terminal and self.arrivals:
            self.totals.completed += 1
            self.totals.gaps.extend(b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False))
        else:
            self.totals.errors += 1
        self.rounds -= 1
        if self.rounds > 0 and self.parser.should_keep_alive():
            self.send()
        else:
            self.close()

    def close(self) -> None:
        self.ended_here = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended_here:
            self.totals.errors += 1  # the target hung up mid-stream
        if not self.done.done():
            self.done.set_result(None)


async def watch_lag(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(LAG_TICK)
        lags.append(time.perf_counter() - began - LAG_TICK)


async def run(url: str, body: bytes, streams: int, rounds: int, start_at: float, timeout: float,
              ) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("paced_client: loopback targets only")
    head = [f"POST {parts.path or '/'} HTTP/1.1", f"host: {host}:{port}", "content-type: application/json",
            f"content-length: {len(body)}"]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    totals = Totals()
    conns: list[Stream] = []
    dones: list[asyncio.Future[None]] = []
    connect_errors = 0
    for _ in range(streams):
        done: asyncio.Future[None] = loop.create_future()
        try:
            _, proto = await loop.create_connection(lambda d=done: Stream(request, rounds, totals, d), host, port)
        except OSError:
            connect_errors += 1
            continue
        conns.append(proto)
        dones.append(done)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    lags: list[float] = []
    stop = asyncio.Event()
    watcher = loop.create_task(watch_lag(lags, stop))
    cpu, wall = sum(os.times()[:2]), time.perf_counter()
    for conn in conns:
        conn.send()
    if dones:
        await asyncio.wait(dones, timeout=timeout)
    for conn in conns:  # past the deadline: whatever is still open is not completed
        conn.close()
    stop.set()
    await watcher
    return {
        "streams": streams * rounds, "completed": totals.completed,
        "errors": totals.errors + connect_errors * rounds,
        "ttft_ms": [round(v * 1000, 3) for v in totals.ttft],
        "gaps_ms": [round(v * 1000, 3) for v in totals.gaps],
        "lag_ms": [round(v * 1000, 3) for v in lags],
        "cpu_s": sum(os.times()[:2]) - cpu, "wall_s": time.perf_counter() - wall,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--body", required=True, help="JSON request body (a streaming request)")
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--rounds", type=int, default=1, help="streams per connection, one after the other")
    p.add_argument("--start-at", type=float, default=0.0, help="time.time() at which to send")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds (capped at 300)")
    args = p.parse_args(argv)
    import uvloop

    result = uvloop.run(run(args.url, args.body.encode(), args.streams, min(args.rounds, 100), args.start_at,
                            min(args.timeout, 300.0)))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
