"""The gateway's configuration file (TOML), decoded and checked with msgspec.

Admission limits have no defaults: an operator must say how many slots an upstream
has. Operational knobs have documented defaults (docs/operations.md), so a file with
only the keys shown in the README is complete. Every mistake raises `ConfigError`
with a message that names the key.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta, Struct

from domain.routing import find_alias_clash
from redaction import masked_url, redacted

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(gt=0)]
NonNegativeInt = Annotated[int, Meta(ge=0)]


class ConfigError(Exception):
    """A configuration mistake; the message names the offending key."""


class Section(Struct, kw_only=True, forbid_unknown_fields=True):
    """Base: unknown keys are errors (a typo must not silently fall back to a default)."""


class ServerConfig(Section):
    listen: str = "127.0.0.1:8080"
    workers: PositiveInt = 1
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    # Input limits (docs/operations.md): each violation is a 4xx in the surface's shape.
    max_header_bytes: PositiveInt = 32 * 1024
    header_timeout_seconds: PositiveFloat = 10.0
    body_timeout_seconds: PositiveFloat = 30.0
    max_messages: PositiveInt = 2048
    max_content_blocks: PositiveInt = 512
    drain_grace_seconds: PositiveFloat = 30.0
    # uvicorn's backstop: connections plus running requests per process (admission is the real limit).
    limit_concurrency: PositiveInt = 4096
    ping_interval_seconds: PositiveFloat = 10.0
    queue_update_interval_seconds: PositiveFloat = 1.0
    # `/llm` streams tell a queued client its place with `event: queue` frames (seed 2.14); false
    # sends SSE comments instead, which strict clients ignore (a request header overrides it).
    queue_events: bool = True
    cors_allowed_origins: list[str] = msgspec.field(default_factory=list)
    access_log: bool = True
    # The client connection (docs/operations.md, "Client connections"): a response write that
    # cannot complete this long drops the client like a hang-up; idle time between requests.
    client_write_timeout_seconds: PositiveFloat = 30.0
    keep_alive_timeout_seconds: PositiveInt = 75


class AdmissionTable(Section):
    """Per-upstream limits (every one required) and the queue's order (defaults: today's)."""

    sequence_slots: PositiveInt
    max_in_flight: PositiveInt
    queue_depth: NonNegativeInt
    queue_timeout_seconds: PositiveFloat
    # "fifo": one arrival-order queue; "fair": priority first, then weighted fairness between
    # consumers, arrival order within one (docs/operations.md).
    fairness: Literal["fifo", "fair"] = "fifo"
    max_queued_per_consumer: PositiveInt | None = None  # one consumer's share of the queue


class UpstreamConfig(Section):
    url: str
    models: Annotated[list[str], Meta(min_length=1)]
    # Shell-style patterns (fnmatch, case-sensitive) for names clients use, tried after the
    # exact `models` of every upstream; the upstream is then called with its first model name.
    aliases: list[Annotated[str, Meta(min_length=1)]] = msgspec.field(default_factory=list)
    admission: AdmissionTable | None = None
    connect_timeout_seconds: PositiveFloat = 5.0
    # A non-streaming answer sends its headers only when generation is done.
    first_byte_timeout_seconds: PositiveFloat = 600.0
    idle_timeout_seconds: PositiveFloat = 120.0
    # The most output tokens one request may ask for (`max_tokens`); none: no gateway cap.
    max_output_tokens: PositiveInt | None = None


class SharedAdmissionConfig(Section):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    lease_seconds: PositiveFloat = 10.0
    key_prefix: str = "gateway"


class TelemetryConfig(Section):
    otlp_endpoint: str | None = None
    service_name: str = "gateway"
    sample_ratio: Annotated[float, Meta(ge=0, le=1)] = 1.0


class AuthConfig(Section):
    """API keys (docs/operations.md): off (one anonymous consumer) unless mode = "required"."""

    mode: Literal["off", "required"] = "off"
    keys_file: str | None = None  # required with mode = "required"
    # How often the keys file is checked for changes: also the revocation delay.
    reload_interval_seconds: PositiveFloat = 5.0
    # Requests of one consumer waiting for one of its `max_in_flight` slots (per process);
    # one more is a 429.
    max_waiting_per_consumer: NonNegativeInt = 64


class Config(Section):
    upstreams: dict[str, UpstreamConfig]
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    admission: SharedAdmissionConfig = msgspec.field(default_factory=SharedAdmissionConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)


_PATH = re.compile(r"`\$((?:[.\[][^`]*)?)`")


def _readable(error: msgspec.ValidationError, prefix: str = "") -> str:
    """Turn msgspec's `$.a.b` paths into `a.b` keys under `prefix`."""
    text = str(error)
    field = re.search(r"field `([^`]+)`", text)
    path = _PATH.search(text)
    where = prefix + (path.group(1) if path else "")
    where = where.lstrip(".")
    if field and ("missing required field" in text or "unknown field" in text):
        key = f"{where}.{field.group(1)}" if where else field.group(1)
        what = "missing required key" if "missing" in text else "unknown key"
        return f"{what} '{key}'"
    message = re.sub(r"\s*-\s*at\s*$", "", _PATH.sub("", text)).strip()
    return f"invalid value for '{where}': {message}" if where else message


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"server.listen must be HOST:PORT, got '{value}'")
    return host.strip("[]") or "0.0.0.0", int(port)


def _check(config: Config) -> None:
    parse_listen(config.server.listen)
    if not config.upstreams:
        raise ConfigError("upstreams: at least one upstream is required")
    seen_addresses: dict[tuple[str, str, int], str] = {}
    seen_models: dict[str, str] = {}
    for name, upstream in config.upstreams.items():
        key = f"upstreams.{name}"
        parts = urlsplit(upstream.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{key}.url must be an http(s) URL, got '{masked_url(upstream.url)}'")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = (parts.scheme, parts.hostname.lower(), port)
        if address in seen_addresses:
            raise ConfigError(
                f"{key}.url: upstreams '{seen_addresses[address]}' and '{name}' have the same "
                f"address {parts.hostname}:{port}; one upstream must have one table"
            )
        seen_addresses[address] = name
        for model in upstream.models:
            if model in seen_models:
                raise ConfigError(
                    f"{key}.models: model '{model}' is already served by "
                    f"'upstreams.{seen_models[model]}'"
                )
            seen_models[model] = name
        table = upstream.admission
        if table is not None and table.max_in_flight >= table.sequence_slots:
            raise ConfigError(
                f"{key}.admission.max_in_flight ({table.max_in_flight}) must be below "
                f"sequence_slots ({table.sequence_slots}) to leave operator headroom"
            )
    _check_aliases(config)
    if config.admission.backend == "redis" and not config.admission.redis_url:
        raise ConfigError("admission.redis_url is required when admission.backend = 'redis'")
    if config.admission.backend == "memory" and config.server.workers > 1:
        raise ConfigError(
            "server.workers > 1 needs admission.backend = 'redis': the in-memory ledger "
            "is only correct in one process"
        )
    if config.auth.mode == "required" and not config.auth.keys_file:
        raise ConfigError("auth.keys_file is required when auth.mode = 'required'")


def _check_aliases(config: Config) -> None:
    """One model name, one upstream: no two upstreams' aliases may claim the same name."""
    upstreams = config.upstreams
    clash = find_alias_clash(
        {name: u.models for name, u in upstreams.items()}, {name: u.aliases for name, u in upstreams.items()}
    )
    if clash is None:
        return
    if clash.exact:
        raise ConfigError(
            f"upstreams.{clash.upstream}.aliases: pattern '{clash.pattern}' matches model "
            f"'{clash.other_name}' of upstreams.{clash.other}.models; a name must route to one upstream"
        )
    raise ConfigError(
        f"upstreams.{clash.upstream}.aliases: pattern '{clash.pattern}' and upstreams.{clash.other}.aliases "
        f"pattern '{clash.other_name}' can both match '{clash.example}'; a name must route to one upstream"
    )


def load_config_text(text: str) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    if not isinstance(raw.get("upstreams"), dict) or not raw["upstreams"]:
        raise ConfigError("missing required table 'upstreams' (at least one upstream)")
    upstreams: dict[str, UpstreamConfig] = {}
    for name, table in raw.pop("upstreams").items():
        try:
            upstreams[name] = msgspec.convert(table, UpstreamConfig)
        except msgspec.ValidationError as exc:
            raise ConfigError(_readable(exc, f"upstreams.{name}")) from None
    try:
        config = msgspec.convert({**raw, "upstreams": {}}, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(_readable(exc)) from None
    config.upstreams = upstreams
    _check(config)
    return config


def load_config(path: str | Path) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from None
    return load_config_text(text)


def dump_config(config: Config) -> str:
    """The effective configuration (defaults filled in) as JSON, for check-config; passwords in
    URLs and keys named like secrets are masked (`redaction`)."""
    shown = redacted(msgspec.to_builtins(config))
    return msgspec.json.format(msgspec.json.encode(shown).decode(), indent=2)
