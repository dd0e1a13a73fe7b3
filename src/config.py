"""The gateway's configuration file (TOML), decoded and checked with msgspec.

Admission limits have no defaults: an operator must say how many slots an upstream
has. Operational knobs have documented defaults (docs/operations.md), so a file with
only the keys shown in the README is complete. Every mistake raises `ConfigError`
with a message that names the key.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from domain.ejection import EjectionPolicy
from domain.reasoning import ReasoningMode
from domain.routing import find_alias_clash
from redaction import masked_url, redacted

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(gt=0)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Port = Annotated[int, Meta(ge=1, le=65535)]
DEFAULT_SCHEME: Literal["http", "https"] = "http"
DEFAULT_REFRESH_SECONDS = 5.0  # Envoy's STRICT_DNS default


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
    # `/llm` streams tell a queued client its place with `event: queue` frames (seed 2.14); false
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


class EndpointsTable(Section):
    """An upstream's replicas (docs/operations.md "Replicas"): fixed `urls`, or `dns` re-resolved
    every `refresh_seconds`; the slots of ONE replica are required. The dns-only keys stay
    unset with `urls` (an error if given) and get their defaults with `dns`."""

    sequence_slots: PositiveInt  # the physical slots of ONE replica (its --max-num-seqs)
    max_in_flight: PositiveInt  # the most this gateway sends ONE replica at once, <= sequence_slots
    urls: Annotated[list[str], Meta(min_length=1)] | UnsetType = UNSET
    dns: Annotated[str, Meta(min_length=1)] | UnsetType = UNSET
    port: Port | UnsetType = UNSET  # required with dns
    scheme: Literal["http", "https"] | UnsetType = UNSET  # with dns; default "http"
    refresh_seconds: PositiveFloat | UnsetType = UNSET  # with dns; default 5
    nameservers: list[str] | UnsetType = UNSET  # with dns; "HOST[:PORT]"; default [] (the system resolver)
    # Outlier ejection, Envoy's semantics and defaults (domain.ejection).
    consecutive_failures: PositiveInt = 5  # counted failures in a row that eject a replica
    base_ejection_seconds: PositiveFloat = 30.0  # ejected for this x the times ejected ...
    max_ejection_seconds: PositiveFloat = 300.0  # ... at most this
    max_ejection_percent: Annotated[int, Meta(ge=0, le=100)] = 50  # of the ready replicas at once
    # The replicas' own load: GET /metrics (vLLM's scheduler gauges) every interval.
    load_metrics: bool = True
    load_metrics_interval_seconds: PositiveFloat = 1.0
    # KV-cache affinity (domain.affinity): "prefix" or "off".
    affinity: Literal["prefix", "off"] = "prefix"
    affinity_max_extra_in_flight: NonNegativeInt = 1  # kept for affinity while in flight <= least loaded + this

    def ejection_policy(self) -> EjectionPolicy:
        return EjectionPolicy(
            consecutive_failures=self.consecutive_failures, base_ejection_seconds=self.base_ejection_seconds,
            max_ejection_seconds=self.max_ejection_seconds, max_ejection_percent=self.max_ejection_percent,
        )

    def replica_urls(self) -> list[str]:
        """The fixed replicas' base URLs (`scheme://host:port`), for `urls` (checked, normalised)."""
        return list(self.urls) if isinstance(self.urls, list) else []


class UpstreamConfig(Section):
    url: str
    models: Annotated[list[str], Meta(min_length=1)]
    # Shell-style patterns (fnmatch, case-sensitive) for names clients use, tried after the
    # exact `models` of every upstream; the upstream is then called with its first model name.
    aliases: list[Annotated[str, Meta(min_length=1)]] = msgspec.field(default_factory=list)
    admission: AdmissionTable | None = None
    # Optional: the upstream's replicas, each request bound to one with a free slot.
    endpoints: EndpointsTable | None = None
    connect_timeout_seconds: PositiveFloat = 5.0
    # A non-streaming answer sends its headers only when generation is done.
    first_byte_timeout_seconds: PositiveFloat = 600.0
    idle_timeout_seconds: PositiveFloat = 120.0
    # The most output tokens one request may ask for (`max_tokens`); none: no gateway cap.
    max_output_tokens: PositiveInt | None = None
    # The most choices one request may ask for (`n`, `best_of`): each is a sequence of the
    # model server's, and takes one slot of the cap (docs/operations.md "Sequences").
    max_choices: PositiveInt = 1
    # Whether the model server applies a thinking budget (vLLM: runs --reasoning-parser): true,
    # false (never sent one), or "auto" (found out from its refusal; domain.reasoning).
    reasoning: ReasoningMode = "auto"


class SharedAdmissionConfig(Section):
    backend: Literal["memory", "redis"] = "memory"
    # Where Redis is (exactly one of the two): a URL (one server, or a cluster's seed node with
    # `redis_cluster = true`), or Sentinel addresses and the master's name (docs/redis-ledger.md).
    redis_url: str | None = None
    redis_sentinels: list[str] | None = None
    redis_sentinel_master: str | None = None
    redis_cluster: bool = False
    lease_seconds: PositiveFloat = 10.0
    key_prefix: str = "gateway"


class OpsConfig(Section):
    """The operations listener: metrics, health and the status page, off the public port."""

    listen: str = "127.0.0.1:9464"  # port 0: any free port (printed at start)


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
    # The secret behind each consumer's vLLM `cache_salt` (domain.cache_salt); none: derived
    # from each consumer's own key digests in the keys file.
    cache_salt_secret_file: str | None = None


class Config(Section):
    upstreams: dict[str, UpstreamConfig]
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    admission: SharedAdmissionConfig = msgspec.field(default_factory=SharedAdmissionConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    ops: OpsConfig = msgspec.field(default_factory=OpsConfig)


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


def parse_listen(value: str, key: str = "server.listen", *, any_port: bool = False) -> tuple[str, int]:
    """HOST:PORT; `any_port` allows port 0 (the system picks a free one)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 if any_port else 1) <= int(port) < 65536:
        raise ConfigError(f"{key} must be HOST:PORT, got '{value}'")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_ops_listen(config: Config) -> tuple[str, int]:
    return parse_listen(config.ops.listen, "ops.listen", any_port=True)


def _check(config: Config) -> None:
    main = parse_listen(config.server.listen)
    if parse_ops_listen(config) == main:
        raise ConfigError(f"ops.listen must differ from server.listen ('{config.ops.listen}' is both)")
    if not config.upstreams:
        raise ConfigError("upstreams: at least one upstream is required")
    seen_addresses: dict[tuple[str, str, int], str] = {}
    seen_models: dict[str, str] = {}
    seen_replicas: dict[str, str] = {}
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
        if upstream.endpoints is not None:
            if table is None:
                raise ConfigError(
                    f"{key}.admission is required when {key}.endpoints is present: the upstream's cap "
                    "and queue are what replicas are picked under"
                )
            _check_endpoints(f"{key}.endpoints", upstream.endpoints, seen_replicas, name)
    _check_aliases(config)
    _check_redis(config.admission)
    if config.admission.backend == "memory" and config.server.workers > 1:
        raise ConfigError(
            "server.workers > 1 needs admission.backend = 'redis': the in-memory ledger "
            "is only correct in one process"
        )
    if config.auth.mode == "required" and not config.auth.keys_file:
        raise ConfigError("auth.keys_file is required when auth.mode = 'required'")


_DNS_NAME = re.compile(r"(?=.{1,253}\.?$)([A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.)*"
                       r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.?")
_DNS_ONLY = ("port", "scheme", "refresh_seconds", "nameservers")


def _check_endpoints(key: str, table: EndpointsTable, seen: dict[str, str], name: str) -> None:
    """Exactly one of `urls` / `dns`, each replica once, slots that fit; fills the dns defaults."""
    if table.max_in_flight > table.sequence_slots:
        raise ConfigError(
            f"{key}.max_in_flight ({table.max_in_flight}) must be at most sequence_slots "
            f"({table.sequence_slots}): more would queue inside the replica"
        )
    if table.max_ejection_seconds < table.base_ejection_seconds:
        raise ConfigError(
            f"{key}.max_ejection_seconds ({table.max_ejection_seconds:g}) must be at least "
            f"base_ejection_seconds ({table.base_ejection_seconds:g})"
        )
    has_urls, has_dns = table.urls is not UNSET, table.dns is not UNSET
    if has_urls == has_dns:
        raise ConfigError(f"{key}: exactly one of '{key}.urls' or '{key}.dns' is required")
    if isinstance(table.urls, list):
        for field in _DNS_ONLY:
            if getattr(table, field) is not UNSET:
                raise ConfigError(f"{key}.{field} applies only with '{key}.dns', not with '{key}.urls'")
        table.urls = [_replica_url(f"{key}.urls[{i}]", url, seen, name) for i, url in enumerate(table.urls)]
        return
    assert isinstance(table.dns, str)
    if not _DNS_NAME.fullmatch(table.dns) or _is_ip(table.dns):
        raise ConfigError(f"{key}.dns must be a DNS name (each A/AAAA record is a replica), got '{table.dns}'")
    if table.port is UNSET:
        raise ConfigError(f"missing required key '{key}.port' (required with '{key}.dns')")
    if table.scheme is UNSET:
        table.scheme = DEFAULT_SCHEME
    if table.refresh_seconds is UNSET:
        table.refresh_seconds = DEFAULT_REFRESH_SECONDS
    if table.nameservers is UNSET:
        table.nameservers = []  # the system resolver
    for i, server in enumerate(table.nameservers):
        nameserver(server, f"{key}.nameservers[{i}]")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _replica_url(key: str, url: str, seen: dict[str, str], name: str) -> str:
    """A replica's base URL, normalised to `scheme://host:port`; each replica belongs to one upstream."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (parts.scheme not in ("http", "https") or not parts.hostname or port == -1
            or parts.path.strip("/") or parts.query or parts.fragment or parts.username):
        raise ConfigError(f"{key} must be an http(s) URL of a server root (scheme://host[:port]), got '{url}'")
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    base = f"{parts.scheme}://{host}:{port or (443 if parts.scheme == 'https' else 80)}"
    if base in seen:
        where = "this upstream" if seen[base] == name else f"upstreams.{seen[base]}"
        raise ConfigError(f"{key}: replica {base} is already listed by {where}; one replica, one upstream")
    seen[base] = name
    return base


def nameserver(text: str, key: str = "nameservers") -> tuple[str, int]:
    """`HOST[:PORT]` of a DNS server (HOST an IP address; `[v6]:PORT` with a port) -> (host, port)."""
    host, port = text, 53
    if text.startswith("["):
        inner, sep, rest = text[1:].partition("]")
        host = inner
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                host = ""
            else:
                port = int(rest[1:])
        elif not sep:
            host = ""
    elif text.count(":") == 1:
        host, _, digits = text.partition(":")
        port = int(digits) if digits.isdigit() else -1
    if not _is_ip(host) or not 0 < port < 65536:
        raise ConfigError(f"{key} must be HOST[:PORT] with HOST an IP address (e.g. '10.96.0.10:53'), got '{text}'")
    return host, port


def _check_redis(shared: SharedAdmissionConfig) -> None:
    """Exactly one way to reach Redis: a URL (one server or a cluster seed) or Sentinels."""
    sentinels = shared.redis_sentinels
    if shared.redis_url and sentinels is not None:
        raise ConfigError("admission.redis_url and admission.redis_sentinels: set exactly one of them")
    if shared.backend == "redis" and not shared.redis_url and sentinels is None:
        raise ConfigError(
            "admission.redis_url is required when admission.backend = 'redis' (or admission.redis_sentinels)")
    if sentinels is not None:
        if not sentinels:
            raise ConfigError("admission.redis_sentinels must list at least one HOST:PORT")
        for i, address in enumerate(sentinels):
            parse_listen(address, f"admission.redis_sentinels[{i}]")
        if not shared.redis_sentinel_master:
            raise ConfigError("admission.redis_sentinel_master is required with admission.redis_sentinels")
        if shared.redis_cluster:
            raise ConfigError("admission.redis_cluster needs admission.redis_url (a cluster node), "
                              "not admission.redis_sentinels")
    elif shared.redis_sentinel_master is not None:
        raise ConfigError("admission.redis_sentinel_master is only used with admission.redis_sentinels")
    if shared.redis_cluster and ("{" in shared.key_prefix or "}" in shared.key_prefix):
        raise ConfigError("admission.key_prefix must not contain '{' or '}' with admission.redis_cluster "
                          "(the keys' hash tags keep each upstream in one cluster slot)")


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
