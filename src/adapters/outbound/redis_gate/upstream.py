"""`Upstream`: what one process knows and keeps about one upstream of the Redis ledger.

Its policy and keys, the script arguments every call starts with, the snapshot cache read
back from the scripts' replies, this process's counters and service time, the token
service charged here and not yet sent (`fairness = "tokens"`), and with
replicas the per-replica cap, this process's view of them (ready, ejected, saturated) and
the shared counts as last read. Plain local state: it never talks to Redis itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from adapters.outbound.redis_gate import scripts
from domain.admission.policy import TOKENS, AdmissionPolicy
from domain.admission.retry_after import DEFAULT_RETRY_AFTER, MAX_RETRY_AFTER
from domain.errors import TooManySequences
from domain.fairness import Use, weighted_tokens
from domain.replicas import Replica, ReplicaState

_COUNTER_NAMES = (
    "admitted", "queued", "rejected_full", "rejected_draining", "timed_out", "abandoned",
    "drained", "unavailable", "lost", "reclaimed",
)


class Upstream:
    """Per-upstream local state: policy, keys, snapshot cache, counters, service time,
    and with replicas the per-replica cap, this process's ready view and the shared counts."""

    __slots__ = ("args", "by_priority", "cache", "charges", "counts", "deadlines", "ejected", "key", "keys", "metered",
                 "oldest", "open", "policy", "ready", "replica_counts", "replica_limit", "saturated", "service",
                 "stamp")

    def __init__(self, key: str, policy: AdmissionPolicy | None, prefix: str, replica_limit: int | None = None) -> None:
        if policy is None and replica_limit is not None:
            raise ValueError(f"upstream {key!r} has replicas but no admission policy")
        self.key, self.policy, self.replica_limit = key, policy, replica_limit
        self.keys, channel = scripts.upstream_keys(prefix, key)
        self.ready: tuple[str, ...] = ()  # this process's discovery view, sorted
        self.ejected: frozenset[str] = frozenset()  # this process's outlier detection, as last told
        self.saturated: frozenset[str] = frozenset()  # the replicas' own load reports, as last told
        # the common ARGV of every script: cap, channel, per-replica cap (0: none), eligible
        # view (`eligible_arg`)
        self.args: list[Any] = [0 if policy is None else policy.max_in_flight, channel, replica_limit or 0, ""]
        self.replica_counts: dict[str, int] = {}  # replica -> slots in flight (all processes), as last read
        self.cache = (0, 0)  # (in_use slots, queued) as last read from Redis
        self.by_priority: dict[int, int] = {}  # waiting per consumer priority other than 0, as last read
        self.stamp = 0  # server time (us) of the reply `cache` came from
        self.deadlines = next(k for k in self.keys if k.endswith(":deadlines"))
        self.oldest: float | None = None  # local-clock arrival of the longest waiter, as last read
        self.counts = dict.fromkeys(_COUNTER_NAMES, 0)
        self.open = 0  # leases held on an uncapped upstream
        self.service: float | None = None  # EWMA of this process's service times
        # fairness = "tokens": consumer -> token service charged here and not yet sent (it goes
        # with the next script call on this upstream, or the refresher's within 0.5 s)
        self.metered = policy is not None and policy.fairness == TOKENS
        self.charges: dict[str, float] = {}

    def charge(self, consumer: str, weight: int, input_tokens: float, output_tokens: float) -> None:
        """Add to the pending batch: weighted tokens divided by the consumer's weight, as
        `TokenOrder.charge` does (below 1 counts as 1)."""
        assert self.policy is not None
        use = Use(input_tokens=input_tokens, output_tokens=output_tokens)
        tokens = weighted_tokens(use, self.policy.output_token_weight) / max(1, weight)
        if tokens:
            self.charges[consumer] = self.charges.get(consumer, 0.0) + tokens

    def take_charges(self) -> str:
        """The pending batch as the scripts' charges argument, emptied: sent once, whatever
        becomes of the call (a charge lost with an unreachable Redis is dropped)."""
        if not self.charges:
            return ""
        batch, self.charges = self.charges, {}
        return scripts.charges(batch)

    def retry_after(self, ahead: int) -> int:
        """Same rule as the in-memory ledger, on this process's observed service times."""
        if self.service is None or self.policy is None:
            return DEFAULT_RETRY_AFTER
        est = math.ceil(self.service * (ahead + 1) / self.policy.max_in_flight)
        return min(MAX_RETRY_AFTER, max(1, est))

    def queued_by_priority(self) -> dict[int, int] | None:
        """Waiting requests per consumer priority (only priorities with some); None while nobody waits."""
        queued = self.cache[1]
        if not queued:
            return None
        out = dict(self.by_priority)
        rest = queued - sum(out.values())
        if rest > 0:
            out[0] = rest
        return dict(sorted(out.items()))

    def check(self, slots: int) -> None:
        """`TooManySequences` when `slots` could never be granted (as `SlotLedger.check`)."""
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
        if self.policy is not None and slots > self.policy.max_in_flight:
            raise TooManySequences(slots, self.policy.max_in_flight)
        if self.replica_limit is not None and slots > self.replica_limit:
            raise TooManySequences(slots, self.replica_limit)

    def set_ready(self, ready: Iterable[str]) -> None:
        addresses = tuple(sorted(set(ready)))
        for address in addresses:
            if not address or any(c.isspace() or c == "|" for c in address):
                raise ValueError(f"a replica address has no spaces and no '|': {address!r}")
        self.ready = addresses
        self.args[3] = self.eligible_arg()

    def set_health(self, ejected: Iterable[str] | None = None, saturated: Iterable[str] | None = None) -> None:
        """This process's ejected and/or saturated replicas (each the whole set, replacing the last)."""
        if ejected is not None:
            self.ejected = frozenset(ejected)
        if saturated is not None:
            self.saturated = frozenset(saturated)
        self.args[3] = self.eligible_arg()

    def eligible_arg(self) -> str:
        """The scripts' ARGV[4]: the ready replicas that are not ejected (they hold the live
        cap, as a draining replica does not), space-separated and sorted; the saturated ones
        among them after a lone "|" (in the cap, never picked). "A C | B": A, B, C hold the
        cap, only A and C may get a request. Without saturated ones, just the list."""
        eligible = [a for a in self.ready if a not in self.ejected]
        pickable = " ".join(a for a in eligible if a not in self.saturated)
        full = " ".join(a for a in eligible if a in self.saturated)
        return f"{pickable} | {full}" if full else pickable

    def preferred(self, prefer: Iterable[str]) -> str:
        """The enter script's affinity argument: the preferred replicas of this view, in order
        (any other could never be picked, and an address with a space would split)."""
        ready = self.ready
        return " ".join(a for a in prefer if a in ready)

    def view(self) -> list[Replica]:
        """This process's ready replicas (ejected ones as EJECTED) and every replica still
        holding slots (draining from this view), in address order, with the shared counts as
        last read and this process's saturated flags."""
        limit = self.replica_limit
        if limit is None:
            return []
        counts, ready, ejected, saturated = self.replica_counts, set(self.ready), self.ejected, self.saturated

        def state(address: str) -> ReplicaState:
            if address not in ready:
                return ReplicaState.DRAINING
            return ReplicaState.EJECTED if address in ejected else ReplicaState.READY

        return [
            Replica(address=a, state=state(a), in_flight=counts.get(a, 0), limit=limit, saturated=a in saturated)
            for a in sorted(ready | {a for a, n in counts.items() if n > 0})
        ]
