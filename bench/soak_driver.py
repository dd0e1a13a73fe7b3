"""The chaos soak's client side and figures (used by `bench/soak.py` and its CI short form).

Requests mix both surfaces, streaming and not; a seeded plan per request decides whether
its client hangs up, and when: after a random delay (while queued, before the first
byte, or wherever it is by then) or mid-stream after a few frames (the connection is
closed). The stub upstream injects random faults (`--fault random`). Afterwards the
figures come from the clients, the gateway's `/metrics`, the stub's `--log` and the
gateway's `/proc/<pid>/status`. Only loopback; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

UPSTREAM = MODEL = "chaos"
CAP, QUEUE = 4, 8
PATHS = {"v1": "/v1/chat/completions", "llm": "/llm/v1/messages"}
SERVER_EXTRA = "queue_update_interval_seconds = 0.2\n"
_STUB_LINE = re.compile(r"max_concurrent=(\d+).*?(?: fault=(\S+))?$")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stub_args(seed: int, fault_rate: float) -> list[str]:
    """The stub's options: short holds, slow-ish streams, random faults (seeded)."""
    return ["--fault", "random", "--fault-rate", str(fault_rate), "--seed", str(seed),
            "--hold", "0.02", "--chunk-delay", "0.004", "--tokens", "12"]  # fmt: skip


def upstream_toml(stub_url: str) -> str:
    """The capped upstream (cap 4, queue 8) with small timeouts."""
    return (f'\n[upstreams.{UPSTREAM}]\nurl = "{stub_url}"\nmodels = ["{MODEL}"]\n'
            "connect_timeout_seconds = 1\nfirst_byte_timeout_seconds = 1\nidle_timeout_seconds = 0.5\n"
            f"[upstreams.{UPSTREAM}.admission]\nsequence_slots = {CAP + 1}\nmax_in_flight = {CAP}\n"
            f"queue_depth = {QUEUE}\nqueue_timeout_seconds = 2\n")  # fmt: skip


@dataclass(frozen=True)
class Plan:
    surface: str
    stream: bool
    hang_up: str  # "none", "early" (after `delay` seconds) or "mid" (after `frames` SSE frames)
    delay: float
    frames: int
    pause: float  # after a 503, the client waits this long before its next request


def plan(seed: int, index: int) -> Plan:
    rng = random.Random(seed * 1_000_003 + index)
    surface, stream = rng.choice(("v1", "llm")), rng.random() < 0.6
    hang_up = rng.choices(("none", "early", "mid"), (6, 2, 2))[0]
    if hang_up == "mid" and not stream:
        hang_up = "early"
    return Plan(surface, stream, hang_up, rng.uniform(0.0, 0.4), rng.randint(1, 6), rng.uniform(0.05, 0.3))


@dataclass
class Figures:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)  # of requests read to their end
    hang_ups: Counter[str] = field(default_factory=Counter)  # by the phase the client was in
    streams_terminated: int = 0  # completed 200 streams that ended with [DONE] / message_stop / error
    streams_error_ended: int = 0  # ... of which with an error frame
    streams_unterminated: int = 0
    unterminated_samples: list[str] = field(default_factory=list)
    stuck: int = 0  # requests still running after the per-request time bound


@dataclass
class _Progress:
    phase: str = "before-response"  # -> "queued" (/llm queue frames) -> "mid-stream"


def _terminal(surface: str, tail: bytes) -> tuple[bool, bool]:
    """(ended with its terminal frame, that frame is an error) for a stream's last bytes."""
    if not tail.endswith(b"\n\n"):
        return False, False
    if surface == "v1":
        return tail.endswith(b"data: [DONE]\n\n"), b'data: {"error"' in tail
    at = tail.rfind(b"event: ")
    name = tail[at + 7 : tail.find(b"\n", at)] if at >= 0 else b""
    return name in (b"message_stop", b"error"), name == b"error"


def request_body(p: Plan) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hello"}]
    if p.surface == "v1":
        return {"model": MODEL, "stream": p.stream, "messages": messages,
                **({"stream_options": {"include_usage": True}} if p.stream else {})}  # fmt: skip
    return {"model": MODEL, "max_tokens": 64, "stream": p.stream, "messages": messages}


async def _exchange(session: aiohttp.ClientSession, base: str, p: Plan, progress: _Progress,
                    figures: Figures) -> int:  # fmt: skip
    async with session.post(base + PATHS[p.surface], json=request_body(p)) as resp:
        if not (p.stream and resp.status == 200):
            await resp.read()
            figures.statuses[resp.status] += 1
            return resp.status
        tail, frames = b"", 0
        async for data in resp.content.iter_any():
            tail = (tail + data)[-1024:]
            if progress.phase != "mid-stream":
                if b"event: queue" in data and b"message_start" not in data:
                    progress.phase = "queued"
                elif b"message_start" in data or b"data: {" in data:
                    progress.phase = "mid-stream"
            if progress.phase == "mid-stream":
                frames += data.count(b"\n\n")
                if p.hang_up == "mid" and frames >= p.frames:
                    resp.close()  # the client closes its connection mid-stream
                    figures.hang_ups["mid-stream"] += 1
                    return 200
        figures.statuses[200] += 1
        ended, error = _terminal(p.surface, tail)
        figures.streams_terminated += ended
        figures.streams_error_ended += ended and error
        if not ended:
            figures.streams_unterminated += 1
            if len(figures.unterminated_samples) < 5:
                figures.unterminated_samples.append(f"{p.surface}: ...{tail[-200:]!r}")
        return 200


async def one(session: aiohttp.ClientSession, base: str, p: Plan, figures: Figures, bound: float) -> int | None:
    """One planned request; an "early" hang-up cancels its task (the connection is dropped).

    Returns the response's status, None after an early hang-up or a failure."""
    progress = _Progress()
    task = asyncio.create_task(_exchange(session, base, p, progress, figures))
    figures.requests += 1
    try:
        async with asyncio.timeout(bound):
            if p.hang_up == "early":
                done, _ = await asyncio.wait({task}, timeout=p.delay)
                if not done:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    figures.hang_ups[progress.phase] += 1
                    return None
            return await task
    except TimeoutError:
        figures.stuck += 1
    except aiohttp.ClientError as exc:  # the gateway broke a connection: never expected
        figures.statuses[-1] += 1
        if len(figures.unterminated_samples) < 5:
            figures.unterminated_samples.append(f"{p.surface}: {exc!r}")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    return None


async def drive(base: str, count: int, concurrency: int, seed: int, *, offset: int = 0,
                bound: float = 15.0) -> Figures:  # fmt: skip
    """Run `count` planned requests with `concurrency` clients; each on its own connection."""
    figures = Figures()
    indices = iter(range(offset, offset + count))
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a hang-up closes a connection of its own
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            for index in indices:
                p = plan(seed, index)
                if await one(session, base, p, figures, bound) == 503:
                    await asyncio.sleep(p.pause)  # as an SDK would after Retry-After (shortened)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return figures


# --- the server side: /metrics, the stub's log, the gateway's memory --------------------


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


@dataclass
class ServerState:
    slots_in_use: float = -1
    queue_depth: float = -1
    statuses: dict[str, float] = field(default_factory=dict)  # gateway_requests_total by status
    admission: dict[str, float] = field(default_factory=dict)  # gateway_admission_total by outcome
    upstream_errors: dict[str, float] = field(default_factory=dict)  # by kind

    def since(self, earlier: ServerState) -> ServerState:
        """The counters' growth since `earlier` (gauges as they are now)."""

        def delta(now: dict[str, float], then: dict[str, float]) -> dict[str, float]:
            return {k: v - then.get(k, 0) for k, v in now.items() if v - then.get(k, 0)}

        return ServerState(self.slots_in_use, self.queue_depth, delta(self.statuses, earlier.statuses),
                           delta(self.admission, earlier.admission),
                           delta(self.upstream_errors, earlier.upstream_errors))  # fmt: skip


async def server_state(base: str) -> ServerState:
    async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as resp:
        text = await resp.text()
    state = ServerState()
    for name, labels, value in metric_samples(text):
        if name == "gateway_requests_total":
            state.statuses[labels["status"]] = state.statuses.get(labels["status"], 0) + value
        elif labels.get("upstream") != UPSTREAM:
            continue
        elif name == "gateway_upstream_slots_in_use":
            state.slots_in_use = value
        elif name == "gateway_upstream_queue_depth":
            state.queue_depth = value
        elif name == "gateway_admission_total":
            state.admission[labels["outcome"]] = value
        elif name == "gateway_upstream_errors_total":
            state.upstream_errors[labels["kind"]] = value
    return state


async def settled(base: str, timeout: float = 10.0) -> ServerState:
    """The gateway's state once its ledger is empty, or whatever it is after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        state = await server_state(base)
        if (state.slots_in_use == 0 and state.queue_depth == 0) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.05)


def stub_log(path: Path, skip: int = 0) -> tuple[int, int, Counter[str]]:
    """(chat requests started, most in flight at once, faults injected by kind) from --log;
    the first `skip` requests count only towards the most in flight."""
    started, most, faults = 0, 0, Counter[str]()
    for line in path.read_text().splitlines():
        match = _STUB_LINE.search(line)
        if match is not None:
            started += 1
            most = max(most, int(match.group(1)))
            if match.group(2) and started > skip:
                faults[match.group(2)] += 1
    return started - skip, most, faults


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
