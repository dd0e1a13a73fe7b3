"""Per-consumer Prometheus counters (API keys on): finished requests, what they used of each
upstream (tokens and slot-seconds: who used the GPUs), and requests refused with 429 by the
limit they were over.

`labels()` hashes and validates its arguments on every call: each (consumer, surface, status)
keeps its request counter, each (consumer, upstream) its three token counters and its
slot-seconds counter, then what they have yet to be increased by. Consumers come from the keys
file (bounded); the caches are cleared (once added) past `_MAX_CONSUMER_CHILDREN`. One process
adds the counts to the counters when they are read (`flush`: render, totals), not up to five
locked `inc` per request; with several workers, at once (the files are what other workers'
scrapes read).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from domain.records import RequestRecord

_MAX_CONSUMER_CHILDREN = 4096  # cached consumer metric children (a cache: labels() stays the truth)
USE_KINDS = ("input", "output", "cached")  # gateway_consumer_tokens_total's `kind`s, in `_use` order


class ConsumerMetrics:
    """`gateway_consumer_requests_total{consumer,surface,status}`,
    `gateway_consumer_tokens_total{consumer,upstream,kind}`,
    `gateway_consumer_slot_seconds_total{consumer,upstream}` and
    `gateway_rate_limited_total{consumer,limit}` in `registry`; `at_once` with several workers."""

    def __init__(self, registry: CollectorRegistry, *, at_once: bool) -> None:
        self._at_once = at_once
        self.requests = Counter(
            "gateway_consumer_requests", "Finished requests per consumer (API keys on)",
            ["consumer", "surface", "status"], registry=registry)
        self.tokens = Counter(
            "gateway_consumer_tokens",
            "Tokens of a consumer's requests that held a slot: input (every prompt token), output, "
            "cached (the prompt tokens the prefix cache served)",
            ["consumer", "upstream", "kind"], registry=registry)
        self.slot_seconds = Counter(
            "gateway_consumer_slot_seconds",
            "Seconds a consumer's requests held upstream sequence slots (admission to release), times the slots",
            ["consumer", "upstream"], registry=registry)
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused with 429, by the limit they were over",
            ["consumer", "limit"], registry=registry)
        # (consumer, surface, status) -> [requests counter, its count not yet added]
        self._children: dict[tuple[str, str, int], list[Any]] = {}
        # (consumer, upstream) -> [input, output, cached, slot-seconds counters, then their counts not yet added]
        self._use: dict[tuple[str, str], list[Any]] = {}

    def finished(self, record: RequestRecord, consumer: str) -> None:
        key = (consumer, record.surface, record.status)
        entry = self._children.get(key)
        if entry is None:
            if len(self._children) >= _MAX_CONSUMER_CHILDREN:  # keys files change: stay bounded
                self.flush()
                self._children.clear()
            entry = self._children[key] = [self.requests.labels(consumer, record.surface, str(record.status)), 0]
        if self._at_once:  # the files now: other workers' scrapes read them
            entry[0].inc()
        else:
            entry[1] += 1
        held, upstream = record.slot_seconds, record.upstream
        if held is not None and upstream is not None:  # it held a slot: it used the GPUs
            self._used(consumer, upstream, record, held)
        if record.rate_limit is not None:
            self.rate_limited.labels(consumer, record.rate_limit).inc()

    def _used(self, consumer: str, upstream: str, record: RequestRecord, held: float) -> None:
        use = self._use.get((consumer, upstream))
        if use is None:
            if len(self._use) >= _MAX_CONSUMER_CHILDREN:
                self.flush()
                self._use.clear()
            tokens = self.tokens
            use = self._use[consumer, upstream] = [
                *(tokens.labels(consumer, upstream, kind) for kind in USE_KINDS),
                self.slot_seconds.labels(consumer, upstream), 0, 0, 0, 0.0]
        if self._at_once:
            if record.input_tokens:
                use[0].inc(record.input_tokens)
            if record.output_tokens:
                use[1].inc(record.output_tokens)
            if record.cached_tokens:
                use[2].inc(record.cached_tokens)
            use[3].inc(held)
        else:
            use[4] += record.input_tokens or 0  # None: not reported (an embedding has no output)
            use[5] += record.output_tokens or 0
            use[6] += record.cached_tokens or 0
            use[7] += held

    def flush(self) -> None:
        """Add the consumer counts not yet added to their counters."""
        for entry in self._children.values():
            if entry[1]:
                entry[0].inc(entry[1])
                entry[1] = 0
        for use in self._use.values():
            for i in range(4):
                if use[i + 4]:
                    use[i].inc(use[i + 4])
                    use[i + 4] = 0
