"""Figures "in the last minute" from cumulative counters sampled now and then (pure).

The counters (requests, tokens, 503s, 429s) only grow; a window keeps a reading about
every `resolution` seconds and answers the growth since the reading `span` seconds ago
(or since the oldest one, just after start). Time is passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class CounterWindow(Generic[K]):
    __slots__ = ("_readings", "resolution", "span")

    def __init__(self, span: float = 60.0, resolution: float = 1.0) -> None:
        self.span, self.resolution = span, resolution
        self._readings: deque[tuple[float, dict[K, float]]] = deque()

    def add(self, now: float, totals: Mapping[K, float]) -> None:
        """Keep a reading (at most one per `resolution`); forget those no longer needed."""
        readings = self._readings
        if readings and now - readings[-1][0] < self.resolution:
            return
        readings.append((now, dict(totals)))
        # keep one reading at or before now - span: the base of a full window
        while len(readings) > 1 and readings[1][0] <= now - self.span:
            readings.popleft()

    def growth(self, now: float, totals: Mapping[K, float]) -> tuple[float, dict[K, float]]:
        """(seconds covered, growth per key) from the base reading to `totals`; keys that did not grow are left out."""
        readings = self._readings
        if not readings:
            return 0.0, {}
        base_at, base = readings[0]
        for at, reading in readings:
            if at > now - self.span:
                break
            base_at, base = at, reading
        grown = {key: value - base.get(key, 0.0) for key, value in totals.items()}
        return max(0.0, now - base_at), {key: value for key, value in grown.items() if value > 0}
