"""The stub upstream's routes, served under uvloop.

``POST /v1/chat/completions`` (``stub.chat``), ``POST /v1/completions`` and
``POST /v1/embeddings`` (``stub.generate``), ``GET|HEAD /health``, ``GET /v1/models``,
``POST /tokenize`` and, with ``--max-num-seqs``, ``GET /metrics``: vLLM 0.32's scheduler
gauges (``stub.metrics``). Anything else is a 404 in vLLM's error shape.
"""

from __future__ import annotations

import asyncio
import signal

import msgspec

from stub import chat, generate
from stub.config import StubConfig
from stub.connection import HttpProtocol, response
from stub.schema import error_body, tokenize_body
from stub.state import StubState

METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class Stub(StubState):
    """The shared state (``stub.state``) and the routing of every request to its answer."""

    def handle(
        self, proto: HttpProtocol, method: bytes, path: bytes, body: bytes, keep: bool
    ) -> asyncio.Task[None] | None:
        """Answer one request; returns a task when the answer must wait (hold, chunk delay)."""
        if self.log_bodies:
            proto.request_body = body
        if path == b"/v1/chat/completions" and method == b"POST":
            return chat.handle(self, proto, body, keep)
        if path in generate.PATHS and method == b"POST":  # text completions, embeddings
            return generate.handle(self, proto, path, body, keep)
        if path == b"/health" and method in (b"GET", b"HEAD"):
            proto.finish(response(200, b"", keep, b"text/plain"), keep)
        elif path == b"/v1/models" and method == b"GET":
            proto.finish(response(200, self.models_body, keep), keep)
        elif path == b"/metrics" and method == b"GET" and self.metrics_body is not None:
            proto.finish(response(200, self.metrics_body(), keep, METRICS_TYPE), keep)
        elif path == b"/tokenize" and method == b"POST":
            try:
                proto.finish(response(200, tokenize_body(body, self.config.max_model_len), keep), keep)
            except (msgspec.DecodeError, ValueError) as exc:
                proto.finish(response(400, error_body(400, str(exc)), keep), keep)
        else:
            message = f"Not Found: {method.decode(errors='replace')} {path.decode(errors='replace')}"
            proto.finish(response(404, error_body(404, message), keep), keep)
        return None


async def serve(config: StubConfig, host: str, port: int) -> None:
    """Run until SIGINT/SIGTERM; prints the bound address once listening."""
    loop = asyncio.get_running_loop()
    stub = Stub(config)
    server = await loop.create_server(lambda: HttpProtocol(stub), host, port, backlog=2048)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()
    print(f"stub listening on http://{host}:{bound[1]}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        stub.close()


def run_server(config: StubConfig, host: str, port: int) -> None:
    """Serve under uvloop (plain asyncio if uvloop is unavailable)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the stub usable anyway
        asyncio.run(serve(config, host, port))
    else:
        uvloop.run(serve(config, host, port))
