"""Helpers of the admission end-to-end tests: requests, hang-ups, `/metrics` (ops listener), the stub log."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tests.support.anthropic_grammar import Event
from tests.support.anthropic_grammar import parse_frames as _parse_frames
from tests.support.metrics import samples
from tests.support.processes import Proc

PATHS = {"v1": "/v1/chat/completions", "llm": "/llm/v1/messages"}
_START = re.compile(r'^(\S+) chat start in_flight=(\d+) max_concurrent=(\d+) model="([^"]*)"')


def admission(max_in_flight: int, queue_depth: int, timeout: float = 30) -> dict[str, float]:
    """An `[upstreams.X.admission]` table (sequence_slots one above the cap)."""
    return {"sequence_slots": max_in_flight + 1, "max_in_flight": max_in_flight,
            "queue_depth": queue_depth, "queue_timeout_seconds": timeout}


def body(surface: str, model: str, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hi"}]
    if surface == "v1":
        return {"model": model, "stream": stream, "messages": messages}
    return {"model": model, "max_tokens": 16, "stream": stream, "messages": messages}


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    body: bytes
    elapsed: float

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=httpx.Limits(max_connections=200))


async def call(c: httpx.AsyncClient, gw: Proc, surface: str, model: str, stream: bool = False) -> Reply:
    """One request to `/v1` or `/llm`, read to the end (a stream's raw SSE body too)."""
    started = time.monotonic()
    response = await c.post(gw.url + PATHS[surface], json=body(surface, model, stream))
    return Reply(response.status_code, response.headers, response.content, time.monotonic() - started)


async def open_raw(
    gw: Proc, surface: str, model: str, stream: bool, path: str | None = None,
    payload: dict[str, Any] | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request sent on a plain socket, so the test decides exactly when to hang up."""
    data = json.dumps(payload if payload is not None else body(surface, model, stream)).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    head = (f"POST {path or PATHS[surface]} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n")
    writer.write(head.encode() + data)
    await writer.drain()
    return reader, writer


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def scrape(c: httpx.AsyncClient, gw: Proc, upstream: str = "reasoning") -> dict[str, float]:
    """One upstream's admission series: `slots_in_use`, `queue_depth`, `admission.<outcome>`..."""
    text = (await c.get(gw.ops_url + "/metrics")).text
    out: dict[str, float] = {}
    for name, labels, value in samples(text):
        if labels.get("upstream") != upstream:
            continue
        if name == "gateway_admission_total":
            out[f"admission.{labels['outcome']}"] = value
        elif name.startswith("gateway_upstream_"):
            out[name[len("gateway_upstream_"):]] = value
    return out


async def until(
    check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 10.0
) -> None:
    """Poll `check` every 20 ms until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


async def until_metric(
    c: httpx.AsyncClient, gw: Proc, name: str, value: float, *, upstream: str = "reasoning",
    timeout: float = 10.0,
) -> None:
    async def check() -> bool:
        return (await scrape(c, gw, upstream)).get(name, 0.0) == value

    await until(check, f"{upstream} {name} == {value}", timeout)


@dataclass(frozen=True)
class Start:
    """One `chat start` line of the stub's --log."""

    at: float
    in_flight: int
    max_concurrent: int
    model: str


def starts(log: Path) -> list[Start]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        match = _START.match(line)
        if match:
            at, in_flight, peak, model = match.groups()
            out.append(Start(float(at), int(in_flight), int(peak), model))
    return out


def logged(log: Path, n: int) -> Callable[[], bool]:
    """A check for `until`: the stub has started `n` chat requests."""
    return lambda: len(starts(log)) == n


def parse_frames(raw: bytes) -> list[Event]:
    """The named SSE events of a recorded `/llm` stream (comments skipped)."""
    return _parse_frames(raw)
