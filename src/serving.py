"""Running the app under uvicorn, with a graceful drain on SIGTERM.

Drain, in order (docs/operations.md):
1. `/readyz` answers 503, so the load balancer stops sending traffic.
2. The gate admits nothing more: new requests and every queued one get 503 +
   `Retry-After` in their surface's shape (a `/llm` stream that already sent queue
   frames gets an in-stream `overloaded_error`).
3. Admitted requests run to completion, up to `server.drain_grace_seconds`.
4. uvicorn stops listening, closes idle connections and the process exits 0.
A second SIGTERM or SIGINT skips the rest of step 3: uvicorn's own graceful shutdown
follows (connections still open get up to half the grace), and a further SIGINT is
uvicorn's force exit.

The ops listener (`[ops] listen`: metrics, health, the status page) is a second
`uvicorn.Server` on its own socket in the same event loop (`OpsServer`); it stops after
the main server, so the drain can be watched on it to the end.

uvicorn is used through its public API only: `uvicorn.Config`, `Server.serve(sockets=...)`,
and `DrainingServer` overrides the public `uvicorn.Server.startup` and `handle_exit` (each
calling uvicorn's) and sets `should_exit`, as uvicorn's own `handle_exit` does;
`OpsServer` overrides the public `capture_signals` (the main server owns the signals).

Before serving, the cyclic GC's youngest generation is collected every `GC_YOUNG_THRESHOLD`
allocations of tracked objects instead of CPython's 700 (`gc.set_threshold`, the older
generations' thresholds unchanged): a request leaves no reference cycle behind (the edge
breaks them), so the young collections found almost nothing and cost 8% of a stream's
instructions (measured with callgrind, bench/README.md); peak RSS under load moved by 0.5 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger("gateway")
GC_YOUNG_THRESHOLD = 10_000  # allocations between collections of the youngest GC generation (module doc)


class Lifecycle:
    """Readiness, shared by the operations endpoints and the drain."""

    __slots__ = ("draining",)

    def __init__(self) -> None:
        self.draining = False

    def ready(self) -> bool:
        return not self.draining


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains instead of stopping at once."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain
        self._draining = False
        self._drain_task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        self._drain_loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._drain_loop = asyncio.get_running_loop()  # where the signal handler schedules the drain
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._drain_loop is None or sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)  # a second signal (or one before startup): uvicorn's shutdown
            return
        self._draining = True
        log.info("gateway draining (signal %d)", sig)
        self._drain_loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain()
        finally:
            self.should_exit = True


class OpsServer(uvicorn.Server):
    """The ops listener's server: it runs beside the main one and leaves signals to it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the main server's handlers drain; this one stops when the main one has


@dataclass(frozen=True)
class Ops:
    """The ops listener of one process: its app and its bound socket."""

    app: Any
    sock: socket.socket


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket (port 0: any free port); OSError if it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def make_drain(
    lifecycle: Lifecycle, gate: Any, grace_seconds: float
) -> Callable[[], Awaitable[None]]:
    """The drain sequence for one process: readiness off, gate closed, wait for idle."""

    async def drain() -> None:
        lifecycle.draining = True
        gate.drain()
        idle = await gate.wait_idle(grace_seconds)
        log.info("gateway drained" if idle else "gateway drain grace period over; stopping anyway")

    return drain


def _uvicorn_config(app: Any, host: str, port: int, grace_seconds: float, http_protocol: type[asyncio.Protocol],
                    limit_concurrency: int, keep_alive: int) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=host, port=port, loop="uvloop", lifespan="on",
        http=http_protocol,  # httptools with the request-head bounds (adapters.inbound._shared.http_guard)
        # A backstop: admission is the real limit; past this uvicorn answers a plain-text 503.
        limit_concurrency=limit_concurrency,
        # Idle time between requests before a client connection is closed (keep_alive_timeout_seconds).
        access_log=False, log_level="warning", timeout_keep_alive=keep_alive,
        server_header=False, date_header=False,
        proxy_headers=False,  # nothing reads the client address; skips a middleware per request
        # After the drain, connections still open (uncapped work) get the rest of the grace.
        timeout_graceful_shutdown=max(1, int(grace_seconds // 2)),
    )


def _ops_config(app: Any, http_protocol: type[asyncio.Protocol], keep_alive: int) -> uvicorn.Config:
    return uvicorn.Config(
        app, loop="uvloop", lifespan="off",  # the main app's lifespan starts and stops what both read
        http=http_protocol, limit_concurrency=64, access_log=False, log_level="warning",
        timeout_keep_alive=keep_alive, server_header=False, date_header=False, proxy_headers=False,
        timeout_graceful_shutdown=1,
    )


def _serve(server: DrainingServer, sockets: list[socket.socket] | None, ops: Ops | None,
           http_protocol: type[asyncio.Protocol], keep_alive: int) -> None:
    """The main server (and the ops one beside it, with the same protocol bounds and
    keep-alive) in one event loop, until drained."""

    async def both() -> None:
        if ops is None:
            await server.serve(sockets=sockets)
            return
        ops_server = OpsServer(_ops_config(ops.app, http_protocol, keep_alive))
        ops_task = asyncio.create_task(ops_server.serve(sockets=[ops.sock]), name="ops-listener")
        try:
            await server.serve(sockets=sockets)
        finally:
            ops_server.should_exit = True
            await ops_task

    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])  # module doc
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(both())


def run(
    app: Any, host: str, port: int, drain: Callable[[], Awaitable[None]], grace_seconds: float, *,
    http_protocol: type[asyncio.Protocol], limit_concurrency: int, keep_alive: int, ops: Ops | None = None,
    sock: socket.socket | None = None,
) -> None:
    """One process: serve until drained, on `sock` when the caller bound it (else uvicorn binds host:port)."""
    config = _uvicorn_config(app, host, port, grace_seconds, http_protocol, limit_concurrency, keep_alive)
    log.info("gateway listening on http://%s:%d", host, port)
    _serve(DrainingServer(config, drain), None if sock is None else [sock], ops, http_protocol, keep_alive)


def run_workers(
    workers: int, host: str, port: int, grace_seconds: float,
    build: Callable[[], tuple[Any, Callable[[], Awaitable[None]], Any]], *,
    http_protocol: type[asyncio.Protocol], limit_concurrency: int, keep_alive: int,
    ops_socket: socket.socket | None = None, sock: socket.socket | None = None,
) -> int:
    """Several processes on one listening socket (only with a shared admission ledger).

    The parent binds the socket (unless the caller has: `sock`), forks the workers before
    any event loop exists, and forwards every SIGTERM/SIGINT to them; each worker builds its
    own app (its own client sessions, gate connection and metrics) and drains on its own
    (`DrainingServer`). Exit status is 0 when every worker exited 0.

    Why not uvicorn's own `workers` (its `Multiprocess` supervisor, uvicorn 0.54), which
    cannot keep that drain through its public API:
    - each worker runs a plain `uvicorn.Server(config)` that the supervisor makes itself
      (`Process.server`; no option names another class), so a worker cannot be a
      `DrainingServer`: on the first SIGTERM it stops listening at once, `/readyz` never
      turns 503, and the gate never refuses its queue (queued requests wait on until
      admitted or cancelled by uvicorn's graceful-shutdown timeout);
    - the parent handles signals by polling a queue every 0.5 s and, after the first
      SIGTERM, blocks joining its workers, so a second signal is never passed on and
      cannot cut a worker's shutdown short;
    - a worker's exit status is not reported (`uvicorn.run` returns normally whatever
      the workers exited with);
    - workers are spawned, not forked: the app, and the protocol class made from the
      config, would have to be importable by name in every worker.
    """
    if sock is None:
        sock = listen_socket(host, port)
    # The ops socket is shared like the main one: any worker answers a scrape, and the
    # metrics are every worker's (prometheus_client's multiprocess mode, see cli).
    children: list[int] = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # worker
            code = 0
            try:
                app, drain, ops_app = build()
                config = _uvicorn_config(app, host, port, grace_seconds, http_protocol, limit_concurrency, keep_alive)
                ops = None if ops_socket is None else Ops(ops_app, ops_socket)
                _serve(DrainingServer(config, drain), [sock], ops, http_protocol, keep_alive)
            except BaseException:
                log.exception("worker failed")
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    log.info("gateway listening on http://%s:%d with %d workers", host, port, workers)

    def forward(sig: int, _: FrameType | None) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    for child in children:
        _, code = os.waitpid(child, 0)
        status = status or int(os.waitstatus_to_exitcode(code) != 0)
    sock.close()
    return status
