"""`[upstreams.NAME]`: the model servers, their admission limits and their replicas, and the
checks that make one model name, one address and one replica belong to one upstream."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import UNSET, Meta, UnsetType

from config.addresses import is_ip, nameserver
from config.section import ConfigError, NonNegativeInt, Port, PositiveFloat, PositiveInt, Section
from domain.ejection import EjectionPolicy
from domain.fairness import DEFAULT_OUTPUT_TOKEN_WEIGHT
from domain.reasoning import ReasoningMode
from domain.routing import find_alias_clash
from redaction import masked_url

DEFAULT_SCHEME: Literal["http", "https"] = "http"
DEFAULT_REFRESH_SECONDS = 5.0  # Envoy's STRICT_DNS default


class AdmissionTable(Section):
    """Per-upstream limits (every one required) and the queue's order (defaults: today's)."""

    sequence_slots: PositiveInt
    max_in_flight: PositiveInt
    queue_depth: NonNegativeInt
    queue_timeout_seconds: PositiveFloat
    # "fifo": one arrival-order queue; "fair": priority first, then weighted fairness between
    # consumers by requests, arrival order within one; "tokens": the same by the tokens each was
    # served (the Virtual Token Counter; memory backend only so far; docs/operations.md).
    fairness: Literal["fifo", "fair", "tokens"] = "fifo"
    max_queued_per_consumer: PositiveInt | None = None  # one consumer's share of the queue
    # What one output token counts for against one prompt token in a consumer's service (the
    # status page's shares and fairness index, `domain.fairness`; the order of "tokens"): decode is memory-bound, one
    # token per step, prefill batched, so an output token costs the GPU about twice as much.
    output_token_weight: PositiveFloat = DEFAULT_OUTPUT_TOKEN_WEIGHT


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
    # A stream whose replica breaks mid-answer goes on on another replica from the token where it
    # broke (docs/resume.md): "tokens" (vLLM's token ids) or "off"; at most `max_resumes` per request.
    resume: Literal["tokens", "off"] = "tokens"
    max_resumes: PositiveInt = 2

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


def check_upstreams(upstreams: dict[str, UpstreamConfig]) -> None:
    """At least one; per upstream an http(s) URL of its own, models no other serves, a cap below
    the slots, replicas under a cap (`_check_endpoints`); no alias claiming another's names."""
    if not upstreams:
        raise ConfigError("upstreams: at least one upstream is required")
    seen_addresses: dict[tuple[str, str, int], str] = {}
    seen_models: dict[str, str] = {}
    seen_replicas: dict[str, str] = {}
    for name, upstream in upstreams.items():
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
    _check_aliases(upstreams)


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
    if not _DNS_NAME.fullmatch(table.dns) or is_ip(table.dns):
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


def _check_aliases(upstreams: dict[str, UpstreamConfig]) -> None:
    """One model name, one upstream: no two upstreams' aliases may claim the same name."""
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
