"""Anthropic's rate-limit headers (`anthropic-ratelimit-*`), on answers and on 429s.

`reset` is an RFC 3339 time (UTC): when the limit is fully replenished.
"""

from __future__ import annotations

import functools
import time

from domain.consumers import RateSnapshot

Headers = list[tuple[bytes, bytes]]


def rfc3339(epoch: float) -> str:
    return _rfc3339_second(int(epoch))


@functools.lru_cache(maxsize=16)
def _rfc3339_second(second: int) -> str:
    # Every answer of a limited consumer names two reset times, mostly the same few seconds.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


def rate_limit_headers(snapshot: RateSnapshot | None) -> Headers:
    """The headers on the wire, in order (requests, then tokens: limit, remaining, reset). This
    runs for every answer of a limited consumer: the names are constants, the values bytes."""
    if snapshot is None:
        return []
    requests, tokens = snapshot.requests, snapshot.tokens
    out: Headers = []
    if requests is not None or tokens is not None:
        now = time.time()
        if requests is not None:
            out += ((b"anthropic-ratelimit-requests-limit", b"%d" % requests.limit),
                    (b"anthropic-ratelimit-requests-remaining", b"%d" % requests.remaining),
                    (b"anthropic-ratelimit-requests-reset", rfc3339(now + requests.reset_seconds).encode()))
        if tokens is not None:
            out += ((b"anthropic-ratelimit-tokens-limit", b"%d" % tokens.limit),
                    (b"anthropic-ratelimit-tokens-remaining", b"%d" % tokens.remaining),
                    (b"anthropic-ratelimit-tokens-reset", rfc3339(now + tokens.reset_seconds).encode()))
    return out
