"""OpenAI's rate-limit headers: shared by every dialect under `/v1` (`_shared/ratelimit_headers.py`)."""

from __future__ import annotations

from adapters.inbound._shared.ratelimit_headers import duration, rate_limit_headers

__all__ = ["duration", "rate_limit_headers"]
