"""What a replica says of its own load (vLLM's scheduler gauges), and what the pick makes of it.

The gateway's counts only see the requests it sent. Another gateway, a batch job, or a
smaller `--max-num-seqs` than configured can fill a replica without them knowing; vLLM
exports `vllm:num_requests_running` and `vllm:num_requests_waiting`, scraped every
`load_metrics_interval_seconds` (`adapters.outbound.vllm_load`).

- A replica whose last report shows `waiting` above 0 is over its real slots: it gets no
  new request until a report shows 0.
- One whose `running` is at or above its `[endpoints] sequence_slots` counts as full.
- A report older than `STALE_INTERVALS` intervals is ignored (fail static: the gateway's
  own counts still bound the replica; stale data never black-holes one), and so is a
  scrape that failed (the last good report ages out).

Saturated replicas keep their slots in the live cap (`ReplicaSet.set_saturated`): they
are back the moment a report says so. The clock is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

STALE_INTERVALS = 3


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """One good scrape of one replica: its gauges summed over its `model_name` labels."""

    running: int
    waiting: int
    at: float  # when it was read (the scraper's clock)


def fresh(report: LoadReport, now: float, interval: float) -> bool:
    return now - report.at <= STALE_INTERVALS * interval


def saturated(report: LoadReport, now: float, interval: float, sequence_slots: int) -> bool:
    """The replica has no room by its own account (and the account is fresh)."""
    return fresh(report, now, interval) and (report.waiting > 0 or report.running >= sequence_slots)


def saturated_replicas(
    reports: Mapping[str, LoadReport], now: float, interval: float, sequence_slots: int
) -> frozenset[str]:
    """The replicas that get no new request now, for `ReplicaSet.set_saturated`."""
    return frozenset(a for a, r in reports.items() if saturated(r, now, interval, sequence_slots))
