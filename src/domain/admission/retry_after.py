"""How long a refused or timed-out client should wait before retrying (pure).

Retry-After, in whole seconds: ceil(S * (ahead + 1) / max_in_flight) clamped to
[1, MAX_RETRY_AFTER], where S is an EWMA (alpha EWMA_ALPHA) of observed service times
(admission -> release) and `ahead` the requests queued in front; DEFAULT_RETRY_AFTER
until the first release. Both gates use these numbers.
"""

from __future__ import annotations

import math

DEFAULT_RETRY_AFTER = 1  # seconds, until a service time has been observed
MAX_RETRY_AFTER = 10  # keep Retry-After small: clients ignore or cap long ones
EWMA_ALPHA = 0.2  # weight of the newest service time


def retry_after(service: float | None, ahead: int, max_in_flight: int) -> int:
    """Seconds to wait with `ahead` requests queued in front and `max_in_flight` served at
    once, given the EWMA `service` of service times (None until the first release)."""
    if service is None:
        return DEFAULT_RETRY_AFTER
    est = math.ceil(service * (ahead + 1) / max_in_flight)
    return min(MAX_RETRY_AFTER, max(1, est))
