"""Where the edge reports finished requests (structured log, metrics, traces)."""

from __future__ import annotations

from typing import Protocol

from domain.records import RequestRecord


class RequestObserver(Protocol):
    def request_finished(self, record: RequestRecord) -> None:
        """Called once per request, after the last byte was sent or the client left."""
        ...
