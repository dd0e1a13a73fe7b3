"""Per-consumer Prometheus counters (API keys on): finished requests, tokens charged, and
requests refused with 429 by the limit they were over.

`labels()` hashes and validates its arguments on every call: each (consumer, surface, status)
keeps its request counter and its two token counters, then what they have yet to be increased
by. Consumers come from the keys file (bounded); the cache is cleared (once added) past
`_MAX_CONSUMER_CHILDREN`. One process adds the counts to the counters when they are read
(`flush`: render, totals), not three locked `inc` per request; with several workers, at once
(the files are what other workers' scrapes read).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from domain.records import RequestRecord

_MAX_CONSUMER_CHILDREN = 4096  # cached consumer metric children (a cache: labels() stays the truth)


class ConsumerMetrics:
    """`gateway_consumer_requests_total{consumer,surface,status}`, `gateway_consumer_tokens_total{consumer,kind}`
    and `gateway_rate_limited_total{consumer,limit}` in `registry`; `at_once` with several workers."""

    def __init__(self, registry: CollectorRegistry, *, at_once: bool) -> None:
        self._at_once = at_once
        self.requests = Counter(
            "gateway_consumer_requests", "Finished requests per consumer (API keys on)",
            ["consumer", "surface", "status"], registry=registry)
        self.tokens = Counter(
            "gateway_consumer_tokens", "Tokens charged to a consumer (prompt | completion)",
            ["consumer", "kind"], registry=registry)
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused with 429, by the limit they were over",
            ["consumer", "limit"], registry=registry)
        # (consumer, surface, status) -> [requests, prompt and completion counters, then their counts not yet added]
        self._children: dict[tuple[str, str, int], list[Any]] = {}

    def finished(self, record: RequestRecord, consumer: str) -> None:
        key = (consumer, record.surface, record.status)
        entry = self._children.get(key)
        if entry is None:
            if len(self._children) >= _MAX_CONSUMER_CHILDREN:  # keys files change: stay bounded
                self.flush()
                self._children.clear()
            entry = self._children[key] = [
                self.requests.labels(consumer, record.surface, str(record.status)),
                self.tokens.labels(consumer, "prompt"), self.tokens.labels(consumer, "completion"),
                0, 0, 0]
        if self._at_once:  # the files now: other workers' scrapes read them
            entry[0].inc()
            if record.input_tokens:
                entry[1].inc(record.input_tokens)
            if record.output_tokens:
                entry[2].inc(record.output_tokens)
        else:
            entry[3] += 1
            if record.input_tokens:
                entry[4] += record.input_tokens
            if record.output_tokens:
                entry[5] += record.output_tokens
        if record.rate_limit is not None:
            self.rate_limited.labels(consumer, record.rate_limit).inc()

    def flush(self) -> None:
        """Add the consumer counts not yet added to their counters."""
        for entry in self._children.values():
            requests, prompt, completion = entry[3], entry[4], entry[5]
            if requests:
                entry[0].inc(requests)
                entry[3] = 0
            if prompt:
                entry[1].inc(prompt)
                entry[4] = 0
            if completion:
                entry[2].inc(completion)
                entry[5] = 0
