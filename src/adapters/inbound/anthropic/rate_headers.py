"""Anthropic's rate-limit headers (`anthropic-ratelimit-*`), on answers and on 429s.

`reset` is an RFC 3339 time (UTC): when the limit is fully replenished.
"""

from __future__ import annotations

import functools
import time

from domain.consumers import RateSnapshot, RateState

Headers = list[tuple[bytes, bytes]]


def rfc3339(epoch: float) -> str:
    return _rfc3339_second(int(epoch))


@functools.lru_cache(maxsize=16)
def _rfc3339_second(second: int) -> str:
    # Every answer of a limited consumer names two reset times, mostly the same few seconds.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


def _limit(state: RateState | None, kind: bytes, now: float, out: Headers) -> None:
    if state is None:
        return
    prefix = b"anthropic-ratelimit-" + kind
    out.append((prefix + b"-limit", str(state.limit).encode()))
    out.append((prefix + b"-remaining", str(state.remaining).encode()))
    out.append((prefix + b"-reset", rfc3339(now + state.reset_seconds).encode()))


def rate_limit_headers(snapshot: RateSnapshot | None) -> Headers:
    out: Headers = []
    if snapshot is not None:
        now = time.time()
        _limit(snapshot.requests, b"requests", now, out)
        _limit(snapshot.tokens, b"tokens", now, out)
    return out


def rate_limit_header_map(snapshot: RateSnapshot) -> dict[str, str]:
    """The same headers for a Litestar `Response` (a successful answer), built as text
    directly: this runs for every answer of a limited consumer."""
    out: dict[str, str] = {}
    now = time.time()
    state = snapshot.requests
    if state is not None:
        out["anthropic-ratelimit-requests-limit"] = str(state.limit)
        out["anthropic-ratelimit-requests-remaining"] = str(state.remaining)
        out["anthropic-ratelimit-requests-reset"] = rfc3339(now + state.reset_seconds)
    state = snapshot.tokens
    if state is not None:
        out["anthropic-ratelimit-tokens-limit"] = str(state.limit)
        out["anthropic-ratelimit-tokens-remaining"] = str(state.remaining)
        out["anthropic-ratelimit-tokens-reset"] = rfc3339(now + state.reset_seconds)
    return out
