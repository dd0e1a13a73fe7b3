"""The upstreams: which upstream serves a model, one aiohttp session per upstream address and
one client per upstream on it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

import aiohttp

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from adapters.outbound.openai_compat.replica_sessions import ReplicaSessions
from config import Config
from domain.routing import ModelRouter

if TYPE_CHECKING:  # imported where used: a process without tracing never loads it
    from adapters.outbound.otel_tracing import OtelTelemetry


def model_router(config: Config) -> ModelRouter:
    """Model name (or alias) -> the upstream serving it."""
    upstreams = config.upstreams
    return ModelRouter({n: u.models for n, u in upstreams.items()}, {n: u.aliases for n, u in upstreams.items()})


def upstream_clients(
    config: Config, sessions: Mapping[str, aiohttp.ClientSession], tracing: OtelTelemetry | None,
    replica_sessions: Mapping[str, ReplicaSessions],
) -> dict[str, OpenAICompatClient]:
    """One client per upstream address, each on its session in `sessions` (by upstream name);
    an upstream with `[endpoints]` calls the chosen replica on that replica's own session."""
    return {
        name: OpenAICompatClient(
            sessions,
            name=name,
            base_url=upstream.url,
            connect_timeout=upstream.connect_timeout_seconds,
            first_byte_timeout=upstream.first_byte_timeout_seconds,
            idle_timeout=upstream.idle_timeout_seconds,
            tracer=tracing,
            replicas=replica_sessions.get(name),
        )
        for name, upstream in config.upstreams.items()
    }


async def upstream_sessions(
    config: Config, sessions: dict[str, aiohttp.ClientSession]
) -> AsyncIterator[dict[str, aiohttp.ClientSession]]:
    """One aiohttp session per upstream address, opened in the serving loop and closed at shutdown.

    aiohttp binds a session to the running event loop, while the clients (and everything
    built on them) are made before it runs: the clients share `sessions`, filled here.
    """
    for name, upstream in config.upstreams.items():
        sessions[name] = upstream_session(upstream.url)
    try:
        yield sessions
    finally:
        opened = list(sessions.values())
        sessions.clear()
        await asyncio.gather(*(session.close() for session in opened))
