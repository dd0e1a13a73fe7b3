"""`[server]`: the public listener, its input limits, its streams, its client connections and the
base of its problem documents' `type` URIs."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

import msgspec

from config.section import ConfigError, NonNegativeInt, PositiveFloat, PositiveInt, Section
from redaction import masked_url

DEFAULT_PROBLEM_BASE_URL = "https://api.riotpiao.com/problems/"


class ServerConfig(Section):
    listen: str = "127.0.0.1:8080"
    workers: PositiveInt = 1
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    # Input limits (docs/operations.md): each violation is a 4xx in the surface's shape.
    max_header_bytes: PositiveInt = 32 * 1024
    header_timeout_seconds: PositiveFloat = 10.0
    body_timeout_seconds: PositiveFloat = 30.0
    max_messages: PositiveInt = 2048
    max_content_blocks: PositiveInt = 512  # per list of blocks, at every level
    # Bounds on the rest of what a client sizes (SECURITY.md), and the image URLs an upstream
    # may be made to fetch (`data:` images count toward max_body_bytes like any content).
    max_stop_sequences: PositiveInt = 16
    max_tools: PositiveInt = 256
    max_tool_schema_bytes: PositiveInt = 65536
    media_url_schemes: list[Literal["https", "http", "data"]] = msgspec.field(
        default_factory=lambda: ["https", "data"]
    )
    drain_grace_seconds: PositiveFloat = 30.0
    # uvicorn's backstop: connections plus running requests per process (admission is the real limit).
    limit_concurrency: PositiveInt = 4096
    ping_interval_seconds: PositiveFloat = 10.0
    queue_update_interval_seconds: PositiveFloat = 1.0
    # `/llm` streams tell a queued client its place with `event: queue` frames; false
    # sends SSE comments instead, which strict clients ignore (a request header overrides it).
    queue_events: bool = True
    cors_allowed_origins: list[str] = msgspec.field(default_factory=list)
    access_log: bool = True
    # The client connection (docs/operations.md, "Client connections"): a response write that
    # cannot complete this long drops the client like a hang-up; idle time between requests.
    client_write_timeout_seconds: PositiveFloat = 30.0
    keep_alive_timeout_seconds: PositiveInt = 75
    # New requests started per turn of the event loop; a burst's others wait for the next
    # turns, in order, so the streams in flight keep their pace (adapters/inbound/_shared/arrivals.py).
    starts_per_loop_turn: NonNegativeInt = 8
    # The base of the RFC 9457 problem documents' `type` URIs (`/v1` failures): the failure's
    # kind is appended to it (`problem_base_url` checks it and gives it its trailing '/').
    problem_base_url: str = DEFAULT_PROBLEM_BASE_URL


def problem_base_url(url: str, key: str = "server.problem_base_url") -> str:
    """`url` as the base of the problem `type` URIs: an absolute http(s) URL, ending in '/' (a
    missing one is added: each problem's kind is appended to it)."""
    if not _absolute_http_url(url):
        raise ConfigError(f"{key} must be an absolute http(s) URL without user, query or fragment, such as "
                          f"'https://example.com/problems/', got '{masked_url(url)}'")
    return url if url.endswith("/") else url + "/"


def _absolute_http_url(url: str) -> bool:
    """`http(s)://host[:port][/path]`: printable ASCII without spaces; no user, query or fragment."""
    if not all("!" <= c <= "~" for c in url) or "?" in url or "#" in url:
        return False
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number in 0..65535 raises ValueError
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "@" not in parts.netloc
