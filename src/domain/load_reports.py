"""What a replica says of its own load (vLLM's scheduler gauges), and what the pick makes of it.

The gateway's counts only see the requests it sent. Another gateway, a batch job, or a
smaller `--max-num-seqs` than configured can fill a replica without them knowing; vLLM
exports `vllm:num_requests_running`, `vllm:num_requests_waiting` and, since its V1 engine,
`vllm:num_requests_waiting_by_reason` (`reason="capacity"`: waiting for a slot or KV blocks;
`reason="deferred"`: waiting for something else, a structured-output grammar being compiled,
a LoRA adapter, a KV transfer), read every `load_metrics_interval_seconds`
(`adapters.outbound.vllm_load`).

- A replica whose report shows requests waiting for capacity (`queued`) is over its real
  slots: it gets no new request until a report shows none. Deferred requests do not count:
  they wait for their own reason, and the replica may well have room.
- One whose `running` is at or above its `[endpoints] sequence_slots` counts as full.
- A report counts for `FRESH_INTERVALS` intervals after it was read, then it is dropped
  (`LoadBook`). A failed read changes nothing: the last good report keeps counting until
  then, and no longer (fail static: the gateway's own counts still bound the replica;
  an old "waiting" never holds one back longer than the window).

Saturated replicas keep their slots in the live cap (`ReplicaSet.set_saturated`): they
are back the moment a report says so, or the moment their report expires. Times are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

FRESH_INTERVALS = 2
"""A report counts this many read intervals after it was read: the next round's read (bounded
by one interval) replaces it before it expires; a replica whose next read fails is judged on
the gateway's own counts alone from then on."""


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """One good read of one replica: its gauges summed over its engines and `model_name`s."""

    running: int
    waiting: int  # `vllm:num_requests_waiting`: received, not running yet (every reason)
    deferred: int = 0  # of those, `num_requests_waiting_by_reason{reason="deferred"}`
    at: float  # when it was read (the reader's clock)

    @property
    def queued(self) -> int:
        """Waiting for room (a slot, KV blocks): vLLM's `reason="capacity"` (all of `waiting`
        from a vLLM that does not split it)."""
        return max(0, self.waiting - self.deferred)


def window(interval: float) -> float:
    """How long a report counts, in seconds, for a read interval."""
    return FRESH_INTERVALS * interval


def fresh(report: LoadReport, now: float, interval: float) -> bool:
    return now - report.at < window(interval)


def saturated(report: LoadReport, now: float, interval: float, sequence_slots: int) -> bool:
    """The replica has no room by its own account (and the account is fresh)."""
    return fresh(report, now, interval) and (report.queued > 0 or report.running >= sequence_slots)


def saturated_replicas(
    reports: Mapping[str, LoadReport], now: float, interval: float, sequence_slots: int
) -> frozenset[str]:
    """The replicas that get no new request now, for `ReplicaSet.set_saturated`."""
    return frozenset(a for a, r in reports.items() if saturated(r, now, interval, sequence_slots))


class LoadBook:
    """One upstream's replicas' reports: the last good one of each followed replica while it is
    fresh, and when each was last read (kept after its report expired, for the age gauge)."""

    __slots__ = ("_followed", "_read_at", "_reports", "interval")

    def __init__(self, interval: float) -> None:
        if not interval > 0:
            raise ValueError("interval must be > 0")
        self.interval = interval
        self._followed: frozenset[str] = frozenset()
        self._reports: dict[str, LoadReport] = {}
        self._read_at: dict[str, float] = {}

    def follow(self, ready: Iterable[str]) -> None:
        """The replicas read from now on (the discovery answer): the others are forgotten."""
        self._followed = frozenset(ready)
        for book in (self._reports, self._read_at):
            for gone in [a for a in book if a not in self._followed]:
                del book[gone]

    @property
    def followed(self) -> frozenset[str]:
        return self._followed

    def record(self, replica: str, report: LoadReport) -> None:
        """A good read (ignored for a replica no longer followed: it left while being read)."""
        if replica in self._followed:
            self._reports[replica] = report
            self._read_at[replica] = report.at

    def forget(self, replica: str) -> None:
        """The replica has no load to read (it answers 404): its report goes at once."""
        self._reports.pop(replica, None)
        self._read_at.pop(replica, None)

    def expire(self, now: float) -> bool:
        """Drop the reports that are no longer fresh; True when one was dropped."""
        stale = [a for a, r in self._reports.items() if not fresh(r, now, self.interval)]
        for address in stale:
            del self._reports[address]
        return bool(stale)

    def fresh(self, now: float) -> dict[str, LoadReport]:
        """The reports that count now (the stale ones are dropped first)."""
        self.expire(now)
        return dict(self._reports)

    def next_expiry(self) -> float | None:
        """When the oldest kept report stops counting; None when none is kept."""
        oldest = min((r.at for r in self._reports.values()), default=None)
        return None if oldest is None else oldest + window(self.interval)

    def read_at(self) -> dict[str, float]:
        """When each followed replica was last read well (its report may have expired since)."""
        return dict(self._read_at)
