"""OpenAI's rate-limit headers (`x-ratelimit-*`), on answers and on 429s, on every `/v1` path.

`reset` is a duration the way OpenAI writes it (`20ms`, `6s`, `1m30s`, `2h0m0s`): how
long until the limit is fully replenished.
"""

from __future__ import annotations

from domain.consumers import RateSnapshot

Headers = list[tuple[bytes, bytes]]


def duration(seconds: float) -> str:
    if seconds < 1:  # the usual case: a bucket short of a few tokens
        return f"{round(seconds * 1000)}ms" if seconds > 0 else "0ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _reset(seconds: float) -> bytes:
    """`duration(seconds).encode()`, the usual case (under a second) straight to bytes."""
    if seconds < 1:
        return b"%dms" % round(seconds * 1000) if seconds > 0 else b"0ms"
    return duration(seconds).encode()


def rate_limit_headers(snapshot: RateSnapshot | None) -> Headers:
    """The headers on the wire, in order (requests, then tokens: limit, remaining, reset). This
    runs for every answer of a limited consumer: the names are constants, the values bytes."""
    if snapshot is None:
        return []
    requests, tokens = snapshot.requests, snapshot.tokens
    out: Headers = []
    if requests is not None:
        out += ((b"x-ratelimit-limit-requests", b"%d" % requests.limit),
                (b"x-ratelimit-remaining-requests", b"%d" % requests.remaining),
                (b"x-ratelimit-reset-requests", _reset(requests.reset_seconds)))
    if tokens is not None:
        out += ((b"x-ratelimit-limit-tokens", b"%d" % tokens.limit),
                (b"x-ratelimit-remaining-tokens", b"%d" % tokens.remaining),
                (b"x-ratelimit-reset-tokens", _reset(tokens.reset_seconds)))
    return out
