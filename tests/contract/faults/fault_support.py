"""Helpers of the upstream-fault tests: one raw request per surface, SSE frames, `/metrics`."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from tests.support.metrics import Sample, gauge, samples

PATHS = {"v1": "/v1/chat/completions", "llm": "/llm/v1/messages"}


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def request_body(surface: str, model: str, stream: bool) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hello"}]
    if surface == "v1":
        return {"model": model, "stream": stream, "messages": messages}
    return {"model": model, "max_tokens": 64, "stream": stream, "messages": messages}


async def send(session: aiohttp.ClientSession, base: str, surface: str, model: str, stream: bool) -> Reply:
    """One request, read to its end (a stream's raw SSE bytes too); 20 s at the most."""
    async with asyncio.timeout(20):
        async with session.post(base + PATHS[surface], json=request_body(surface, model, stream)) as resp:
            return Reply(resp.status, resp.content_type, await resp.read())


def data_frames(body: bytes) -> list[str]:
    """The `data:` payloads of an OpenAI-style SSE body, in order."""
    text = body.decode()
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-120:]!r}"
    out = []
    for frame in text.split("\n\n")[:-1]:
        lines = [line for line in frame.split("\n") if line and not line.startswith(":")]
        if lines:
            assert len(lines) == 1 and lines[0].startswith("data: "), frame
            out.append(lines[0][len("data: ") :])
    return out


async def metrics(session: aiohttp.ClientSession, base: str) -> list[Sample]:
    async with session.get(base + "/metrics") as resp:
        return samples(await resp.text())


def statuses(page: list[Sample]) -> set[str]:
    """Every status counted in `gateway_requests_total`."""
    return {labels["status"] for name, labels, value in page if name == "gateway_requests_total" and value}


async def until_idle(session: aiohttp.ClientSession, base: str, upstream: str, timeout: float = 5.0) -> None:
    """Poll `/metrics` until the upstream's slots and queue are both 0 (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        page = await metrics(session, base)
        slots = gauge(page, "gateway_upstream_slots_in_use", upstream)
        queued = gauge(page, "gateway_upstream_queue_depth", upstream)
        assert slots is not None, f"no slots gauge for {upstream}: is the upstream capped?"
        if slots == 0 and queued == 0:
            return
        assert time.monotonic() < deadline, f"{upstream}: slots_in_use={slots} queue_depth={queued}"
        await asyncio.sleep(0.02)
