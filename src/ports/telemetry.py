"""Where the edge reports finished requests (structured log, metrics, traces)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from domain.records import RequestRecord


class RequestObserver(Protocol):
    def request_started(self, record: RequestRecord, headers: list[tuple[bytes, bytes]]) -> object:
        """Called when a request arrives; the result is handed back to `request_finished`.

        It runs in the request's own task, so a tracer can make its span current here.
        """
        ...

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        """Called once per request, after the last byte was sent or the client left."""
        ...


AttributeValue = str | int | float | bool


class Span(Protocol):
    def set(self, key: str, value: AttributeValue) -> None: ...

    def event(self, name: str, attributes: Mapping[str, AttributeValue]) -> None:
        """Record that something happened during the span (OpenTelemetry's span event)."""
        ...

    def end(self, error: str | None = None) -> None:
        """Finish the span; `error` marks it failed with that description."""
        ...


class Tracer(Protocol):
    """Starts spans as children of the current request's span (never made current)."""

    def start(self, name: str) -> Span: ...


class _NullSpan:
    __slots__ = ()

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def event(self, name: str, attributes: Mapping[str, AttributeValue]) -> None:
        pass

    def end(self, error: str | None = None) -> None:
        pass


class NullTracer:
    """Tracing switched off: no spans, (almost) no cost."""

    __slots__ = ()
    _span = _NullSpan()

    def start(self, name: str) -> Span:
        return self._span
