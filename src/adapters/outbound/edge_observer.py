"""Everything that hears about a request at the edge: access log, metrics, traces."""

from __future__ import annotations

from domain.records import RequestRecord
from ports.telemetry import RequestObserver


class EdgeObserver:
    """Fans each request out to the log and metrics, and to tracing when it is on."""

    __slots__ = ("_observers", "_tracing")

    def __init__(self, *observers: RequestObserver, tracing: RequestObserver | None = None) -> None:
        self._observers = observers
        self._tracing = tracing

    def request_started(self, record: RequestRecord, headers: list[tuple[bytes, bytes]]) -> object:
        return None if self._tracing is None else self._tracing.request_started(record, headers)

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        for observer in self._observers:
            observer.request_finished(record)
        if self._tracing is not None:
            self._tracing.request_finished(record, handle)
