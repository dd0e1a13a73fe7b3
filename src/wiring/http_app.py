"""The HTTP app: every registered dialect's Router and the health endpoints on one Litestar app,
the lifespan that starts and stops what they use, the edge's input limits and arrival pacer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib.metadata import version
from typing import Any

from dependency_injector import containers
from litestar import Litestar
from litestar.config.cors import CORSConfig

import serving
from adapters.inbound._shared.arrivals import ArrivalPacer
from adapters.inbound._shared.dialect import DialectRouter, EdgeContext
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound._shared.openapi import openapi_config
from adapters.inbound.operations import health_handlers
from config import Config
from domain.routing import ModelRouter
from wiring.replicas import start_load_scrapers
from wiring.upstreams import model_router


def input_limits(config: Config, router: ModelRouter | None = None) -> InputLimits:
    """The edge's input limits; `max_output_tokens` is per upstream, looked up per model (aliases too)."""
    server = config.server
    caps = (router or model_router(config)).per_model(
        {name: u.max_output_tokens for name, u in config.upstreams.items() if u.max_output_tokens is not None}
    )
    return InputLimits(
        max_header_bytes=server.max_header_bytes, body_timeout_seconds=server.body_timeout_seconds,
        max_messages=server.max_messages, max_content_blocks=server.max_content_blocks, max_output_tokens=caps,
        max_stop_sequences=server.max_stop_sequences, max_tools=server.max_tools,
        max_tool_schema_bytes=server.max_tool_schema_bytes, media_url_schemes=frozenset(server.media_url_schemes),
        max_choices=(router or model_router(config)).per_model(
            {n: u.max_choices for n, u in config.upstreams.items()}),
    )


def arrivals(config: Config) -> ArrivalPacer | None:
    """The process's pacer of new requests (`arrivals.ArrivalPacer`), unless turned off (0)."""
    per_turn = config.server.starts_per_loop_turn
    return ArrivalPacer(per_turn) if per_turn else None


def lifespan(container: containers.Container) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """Start, in order, what the requests use (the first request finds it all running); stop it
    in the reverse order. `container` is `bootstrap.Container`."""
    @asynccontextmanager
    async def span(_: Litestar) -> AsyncIterator[None]:
        credentials = container.credentials()
        if credentials is not None:
            await credentials.start()  # before serving: no request is ever checked against nothing
        counters = [c for c in (container.usage(), container.consumer_concurrency()) if c is not None]
        try:
            await container.init_resources()  # type: ignore[misc]  # the upstream sessions are async
            gate = container.gate()
            await gate.start()
            replicas = container.replica_watch()
            await replicas.start()  # the first answers reach the gate before the first request
            await start_load_scrapers(container.config(), gate, container.metrics(), container.load_scrapers())
            for counter in counters:
                await counter.start()
            status = container.status_board()
            await status.start()
            try:
                yield
            finally:
                await status.close()
                for counter in counters:
                    await counter.close()
                await replicas.close()
                await asyncio.gather(*(scraper.close() for scraper in container.load_scrapers().values()))
                container.replica_care().close()
                await gate.close()
                affinity = container.affinity_store()
                if affinity is not None:
                    await affinity.close()
                await asyncio.gather(*(pool.close() for pool in container.replica_sessions().values()))
                await container.shutdown_resources()  # type: ignore[misc]
        finally:
            if credentials is not None:
                await credentials.close()

    return span


def litestar_app(
    config: Config, dialects: Sequence[DialectRouter], context: EdgeContext,
    lifecycle: serving.Lifecycle, container: containers.Container,
) -> EdgeMiddleware:
    """Every registered dialect's Router plus the health endpoints, on one Litestar app (the
    metrics and the status page are on the ops listener's app: `ops_app`), wrapped in the
    edge middleware (`edge.EdgeMiddleware`: its `app` is the Litestar app)."""
    handlers: list[Any] = [dialect(context) for dialect in dialects]
    handlers += health_handlers(lifecycle.ready, container.replica_watch().without_replicas)
    server = config.server
    cors = (
        CORSConfig(allow_origins=server.cors_allowed_origins, allow_methods=["GET", "POST", "OPTIONS"],
                   allow_headers=["*"], expose_headers=["request-id", "x-request-id", "retry-after"])
        if server.cors_allowed_origins
        else None
    )
    app = Litestar(route_handlers=handlers, lifespan=[lifespan(container)], cors_config=cors,
                   openapi_config=openapi_config(version("gateway")), logging_config=None)
    app.state.container = container
    return EdgeMiddleware(app, container.arrivals())
