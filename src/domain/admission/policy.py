"""The admission policy of one upstream: its cap, its queue's depth, wait and order (pure)."""

from __future__ import annotations

import math

import msgspec

from domain.fairness import DEFAULT_OUTPUT_TOKEN_WEIGHT

FIFO, FAIR, TOKENS = "fifo", "fair", "tokens"
FAIRNESS = (FIFO, FAIR, TOKENS)


class AdmissionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Cap, queue depth and queue wait of one upstream (no defaults on purpose), and the
    queue's order: `fifo` (arrival order, `domain.admission.fifo_order`), `fair`
    (`domain.admission.fair_order`) or `tokens` (`domain.admission.token_order`, where an
    output token counts `output_token_weight` prompt tokens); optionally the most requests
    one consumer may have waiting (None: up to `queue_depth`)."""

    max_in_flight: int
    queue_depth: int
    queue_timeout_seconds: float
    fairness: str = FIFO
    max_queued_per_consumer: int | None = None
    output_token_weight: float = DEFAULT_OUTPUT_TOKEN_WEIGHT

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> AdmissionPolicy:
        """Return self, or raise ValueError naming the first invalid field."""
        for name in ("max_in_flight", "queue_depth"):
            value, low = getattr(self, name), 1 if name == "max_in_flight" else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        t = self.queue_timeout_seconds
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 < t < math.inf:
            raise ValueError(f"queue_timeout_seconds must be a number > 0, got {t!r}")
        if self.fairness not in FAIRNESS:
            raise ValueError(f"fairness must be one of {', '.join(FAIRNESS)}, got {self.fairness!r}")
        m = self.max_queued_per_consumer
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise ValueError(f"max_queued_per_consumer must be an integer >= 1, got {m!r}")
        w = self.output_token_weight
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0 < w < math.inf:
            raise ValueError(f"output_token_weight must be a number > 0, got {w!r}")
        return self
