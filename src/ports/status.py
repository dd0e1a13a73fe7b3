"""The live status of the gateway (`GET /status`, `GET /status.json` on the ops listener).

Read from the same in-process state the metrics are: the gate's snapshot (with Redis, the
shared figures) and the request counters (with several workers, every worker's).
docs/operations.md documents the JSON, field by field.
"""

from __future__ import annotations

from typing import Protocol

import msgspec


class ReplicaStatus(msgspec.Struct, kw_only=True):
    """One replica of an upstream (`[upstreams.NAME.endpoints]`)."""

    address: str
    state: str  # "ready" | "draining" | "ejected"
    in_flight: int
    limit: int | None


class ConsumerShareStatus(msgspec.Struct, kw_only=True):
    """What one consumer used of one upstream in the window (`domain.fairness`), API keys on."""

    name: str
    input_tokens: int  # every prompt token, cached ones included
    output_tokens: int
    cached_tokens: int  # of input_tokens, those the prefix cache served
    weighted_tokens: float  # input + output_token_weight x output
    token_share: float  # of the upstream's weighted tokens in the window, 0..1
    slot_seconds: float  # slots held x seconds
    slot_share: float  # of the upstream's slot-seconds in the window, 0..1
    service: float  # weighted_tokens / the consumer's weight: what the fairness index compares


class UpstreamStatus(msgspec.Struct, kw_only=True):
    name: str
    capped: bool
    cap: int | None  # max_in_flight; None: uncapped
    in_flight: int
    queue_depth: int
    queue_limit: int | None
    queue_timeout_seconds: float | None
    oldest_wait_seconds: float | None  # the longest a request now queued has waited; None: nobody / unknown
    queued_by_priority: dict[str, int]  # consumer priority -> waiting; {} while nobody waits (or not counted)
    unavailable_last_minute: int  # 503s (queue full, queue timeout, draining, Redis away) in the window
    unavailable_by_reason: dict[str, int]  # error kind -> count, in the window
    replicas: list[ReplicaStatus]  # empty until the upstream has [endpoints]
    # Jain's index of the consumers' service in the window (1.0: fewer than 2, or keys off)
    fairness_index: float = 1.0
    # API keys on: each consumer served or waiting here in the window, by name
    consumers: list[ConsumerShareStatus] = msgspec.field(default_factory=list)


class ConsumerStatus(msgspec.Struct, kw_only=True):
    name: str
    requests_last_minute: int
    tokens_last_minute: int
    limited_last_minute: int  # 429s in the window
    limited_by_limit: dict[str, int]  # requests_per_minute | tokens_per_minute | tokens_per_day -> 429s
    requests_per_minute: int | None  # the consumer's limits (keys file); None: unlimited or unknown
    tokens_per_minute: int | None


class StatusReport(msgspec.Struct, kw_only=True):
    time: float  # Unix seconds at the server
    window_seconds: float  # what the *_last_minute figures cover: 60, less just after start
    ready: bool  # False while draining
    backend: str  # "memory" | "redis"
    workers: int
    auth: bool  # API keys on: `consumers` lists who sent requests in the window
    upstreams: list[UpstreamStatus]
    consumers: list[ConsumerStatus]


class StatusSource(Protocol):
    def report(self) -> StatusReport: ...
