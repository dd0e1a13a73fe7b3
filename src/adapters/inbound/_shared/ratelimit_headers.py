"""OpenAI's rate-limit headers (`x-ratelimit-*`), on answers and on 429s, on every `/v1` path.

`reset` is a duration the way OpenAI writes it (`20ms`, `6s`, `1m30s`, `2h0m0s`): how
long until the limit is fully replenished.
"""

from __future__ import annotations

from domain.consumers import RateSnapshot, RateState

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


def _limit(state: RateState | None, kind: bytes, out: Headers) -> None:
    if state is None:
        return
    out.append((b"x-ratelimit-limit-" + kind, str(state.limit).encode()))
    out.append((b"x-ratelimit-remaining-" + kind, str(state.remaining).encode()))
    out.append((b"x-ratelimit-reset-" + kind, duration(state.reset_seconds).encode()))


def rate_limit_headers(snapshot: RateSnapshot | None) -> Headers:
    out: Headers = []
    if snapshot is not None:
        _limit(snapshot.requests, b"requests", out)
        _limit(snapshot.tokens, b"tokens", out)
    return out


def rate_limit_header_map(snapshot: RateSnapshot) -> dict[str, str]:
    """The same headers for a Litestar `Response` (a successful answer), built as text
    directly: this runs for every answer of a limited consumer."""
    requests, tokens = snapshot.requests, snapshot.tokens
    if requests is not None and tokens is not None:  # the usual consumer: one dict display
        return {
            "x-ratelimit-limit-requests": str(requests.limit),
            "x-ratelimit-remaining-requests": str(requests.remaining),
            "x-ratelimit-reset-requests": duration(requests.reset_seconds),
            "x-ratelimit-limit-tokens": str(tokens.limit),
            "x-ratelimit-remaining-tokens": str(tokens.remaining),
            "x-ratelimit-reset-tokens": duration(tokens.reset_seconds),
        }
    out: dict[str, str] = {}
    if requests is not None:
        out["x-ratelimit-limit-requests"] = str(requests.limit)
        out["x-ratelimit-remaining-requests"] = str(requests.remaining)
        out["x-ratelimit-reset-requests"] = duration(requests.reset_seconds)
    if tokens is not None:
        out["x-ratelimit-limit-tokens"] = str(tokens.limit)
        out["x-ratelimit-remaining-tokens"] = str(tokens.remaining)
        out["x-ratelimit-reset-tokens"] = duration(tokens.reset_seconds)
    return out
