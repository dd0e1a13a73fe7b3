"""The rig of bench/fairness.py: a paced stub, a private Redis, gateways with a keys file of two
consumers, the consumers' floods, and what the gateways (`/metrics`) and the stub (`--log`) count.

Every process is started through `targets.Procs` (its own session, stopped by `stop_all`);
everything listens on and talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from targets import Procs, free_port, gateway_python

MODEL = "m"
WHO = ("A", "B")
ANSWER = {"A": 400, "B": 20}  # max_tokens of each consumer's requests: the stub answers exactly that many
SLOTS = 4  # the stub's --max-num-seqs and the upstream's sequence_slots (above the cap: nothing waits inside)
CAP = 2  # [upstreams.m.admission] max_in_flight
MAX_REQUESTS = 10_000  # per flood worker, at most (the window ends it long before)
_OPS_LINE = re.compile(r"gateway ops listening on http://\S+?:(\d+)")
_USER = re.compile(r' chat start .* user="([AB]) wants')


class Refused(Exception):
    """A gateway exited before it answered /healthz (a configuration it does not take)."""


@dataclass
class Gateway:
    url: str
    ops_url: str
    proc: subprocess.Popen[bytes]


@dataclass
class Use:
    """One consumer's counts on the upstream, from `/metrics` (summed over the gateways)."""

    requests: float = 0.0  # finished with 200
    input: float = 0.0
    output: float = 0.0
    slot_seconds: float = 0.0

    def weighted(self, output_weight: float = 2.0) -> float:
        return self.input + output_weight * self.output

    def minus(self, other: Use) -> Use:
        return Use(self.requests - other.requests, self.input - other.input, self.output - other.output,
                   self.slot_seconds - other.slot_seconds)


@dataclass
class Tally:
    """What the flood workers saw: streams read to the end, and failures (status, reason)."""

    done: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WHO, 0))
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WHO, 0))
    last_failure: str = ""
    both_served: asyncio.Event = field(default_factory=asyncio.Event)  # each consumer had an answer


def new_key() -> str:
    """A gateway-format key, `gw_<8 hex>_<43 base64url chars>`, new for every run."""
    return f"gw_{secrets.token_hex(4)}_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def keys_file(path: Path, keys: dict[str, str], weights: dict[str, int]) -> Path:
    path.write_text("".join(
        f'[consumers.{who}]\nkeys = ["sha256:{hashlib.sha256(key.encode()).hexdigest()}"]\nweight = {weights[who]}\n'
        for who, key in keys.items()))
    return path


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            said = next((line for line in reversed(lines) if line.startswith("gateway:")), lines[-1] if lines else "")
            raise Refused(said.removeprefix("gateway:").strip() or f"exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s (log: {log})")


def start_stub(procs: Procs, name: str, chunk_delay: float) -> tuple[str, Path]:
    """The stub paced like vLLM (a token every `chunk_delay` s, at most SLOTS sequences), with its --log."""
    port, log = free_port(), procs.workdir / f"{name}-requests.log"
    argv = [sys.executable, "-m", "stub", "--listen", f"127.0.0.1:{port}", "--tokens", str(max(ANSWER.values())),
            "--chunk-delay", str(chunk_delay), "--max-num-seqs", str(SLOTS), "--models", MODEL, "--log", str(log)]
    proc, out = procs.spawn(name, argv, None)
    _ready(f"http://127.0.0.1:{port}/health", proc, out, 20)
    return f"http://127.0.0.1:{port}", log


def start_redis(procs: Procs) -> str:
    """A private redis-server on a free loopback port (nothing persisted); its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (scripts/ensure-redis installs it)")
    port = free_port()
    procs.spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", str(procs.workdir)], None)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def start_gateway(procs: Procs, name: str, stub_url: str, keys: Path, fairness: str, redis: str | None) -> Gateway:
    """`gateway serve`: API keys required, one upstream capped at CAP with `fairness`; with
    `redis`, the shared Redis ledger (`key_prefix` per gateway pair: rows never share state)."""
    port, config = free_port(), procs.workdir / f"{name}.toml"
    shared = ("" if redis is None else
              f'[admission]\nbackend = "redis"\nredis_url = "{redis}"\nkey_prefix = "{procs.workdir.name}"\n')
    config.write_text(
        f'[server]\nlisten = "127.0.0.1:{port}"\naccess_log = false\n[ops]\nlisten = "127.0.0.1:0"\n'
        f'[auth]\nmode = "required"\nkeys_file = "{keys}"\n{shared}'
        f'[upstreams.{MODEL}]\nurl = "{stub_url}"\nmodels = ["{MODEL}"]\n'
        f"[upstreams.{MODEL}.admission]\nsequence_slots = {SLOTS}\nmax_in_flight = {CAP}\nqueue_depth = 64\n"
        f'queue_timeout_seconds = 600\nfairness = "{fairness}"\n')
    proc, log = procs.spawn(name, [gateway_python(), "-m", "cli", "serve", "--config", str(config)], None)
    _ready(f"http://127.0.0.1:{port}/healthz", proc, log, 30)
    match = _OPS_LINE.search(log.read_text(errors="replace"))
    if match is None:
        raise RuntimeError(f"{name} printed no ops listener line (log: {log})")
    return Gateway(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{match.group(1)}", proc)


async def use(c: httpx.AsyncClient, gateways: list[Gateway]) -> dict[str, Use]:
    """Each consumer's requests, tokens and slot seconds on the upstream, summed over `gateways`."""
    out = {who: Use() for who in WHO}
    for gw in gateways:
        page = (await c.get(gw.ops_url + "/metrics")).text
        for family in text_string_to_metric_families(page):
            for s in family.samples:
                mine = out.get(s.labels.get("consumer", ""))
                if mine is None:
                    continue
                if s.name == "gateway_consumer_requests_total" and s.labels.get("status") == "200":
                    mine.requests += s.value
                elif s.name == "gateway_consumer_tokens_total" and s.labels.get("upstream") == MODEL:
                    kind = s.labels.get("kind")
                    if kind in ("input", "output"):
                        setattr(mine, kind, getattr(mine, kind) + s.value)
                elif s.name == "gateway_consumer_slot_seconds_total" and s.labels.get("upstream") == MODEL:
                    mine.slot_seconds += s.value
    return out


def stub_started(log: Path) -> dict[str, int]:
    """Chat requests the stub started, per consumer (its --log: one line each, `user=` tells whose)."""
    started = dict.fromkeys(WHO, 0)
    for line in log.read_text(errors="replace").splitlines():
        match = _USER.search(line)
        if match:
            started[match.group(1)] += 1
    return started


async def flood(c: httpx.AsyncClient, gw: Gateway, who: str, key: str, stop: asyncio.Event, tally: Tally) -> None:
    """Streamed requests of `who`, one after the other, until `stop` (the one under way ends first)."""
    body = {"model": MODEL, "stream": True, "max_tokens": ANSWER[who], "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"{who} wants a story"}]}
    headers = {"authorization": f"Bearer {key}"}
    for _ in range(MAX_REQUESTS):
        if stop.is_set():
            return
        try:
            async with c.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                text = b"".join([chunk async for chunk in r.aiter_bytes()])
            if r.status_code == 200 and text.rstrip().endswith(b"data: [DONE]"):
                tally.done[who] += 1
                if min(tally.done.values()) > 0:
                    tally.both_served.set()
                continue
            tally.last_failure = f"{who}: {r.status_code} {text[-200:]!r}"
        except httpx.HTTPError as error:
            tally.last_failure = f"{who}: {error!r}"
        tally.failed[who] += 1
        await asyncio.sleep(0.2)  # a failure does not spin
