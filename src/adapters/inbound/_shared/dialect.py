"""The registration point for inbound dialects.

A dialect is a package under `adapters/inbound/` exposing a `dialect` object with a
`name` (its surface label) and `routes(context)`. Bootstrap lists the dialects it
serves; adding one touches nothing in domain, ports, application or outbound code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from adapters.inbound._shared.limits import InputLimits
from application.chat import ChatService
from ports.telemetry import RequestObserver

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class EdgeContext:
    """What every dialect gets from bootstrap."""

    service: ChatService
    observer: RequestObserver
    max_body_bytes: int
    ping_interval_seconds: float
    options: dict[str, Any] = field(default_factory=dict)
    limits: InputLimits = field(default_factory=InputLimits)


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    methods: tuple[str, ...]
    endpoint: ASGIApp
    # A mount answers every path below `path` that no other route matches (a dialect's 404).
    mount: bool = False


class InboundDialect(Protocol):
    name: str

    def routes(self, context: EdgeContext) -> Sequence[Route]: ...
