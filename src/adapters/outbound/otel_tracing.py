"""OpenTelemetry traces: a server span per request, admission and upstream child spans.

Export is OTLP/HTTP. It is on when `[telemetry] otlp_endpoint` is set or when the
standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
variables are (the SDK reads those and the other `OTEL_*` variables itself);
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off. When it is off,
bootstrap does not build this class at all: requests pay nothing for tracing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from domain.records import RequestRecord
from ports.telemetry import AttributeValue

_PROPAGATOR = TraceContextTextMapPropagator()


class _AsgiHeaders(Getter[list[tuple[bytes, bytes]]]):
    def get(self, carrier: list[tuple[bytes, bytes]], key: str) -> list[str] | None:
        name = key.lower().encode()
        values = [v.decode("latin-1") for k, v in carrier if k == name]
        return values or None

    def keys(self, carrier: list[tuple[bytes, bytes]]) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier]


_GETTER = _AsgiHeaders()


class _Span:
    """Adapts an OTel span to the `ports.telemetry.Span` protocol."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Mapping[str, AttributeValue]) -> None:
        self._span.add_event(name, dict(attributes))

    def end(self, error: str | None = None) -> None:
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()


class OtelTelemetry:
    """Owns the tracer provider; is both a `Tracer` port and a request observer."""

    def __init__(self, service_name: str, otlp_endpoint: str | None, sample_ratio: float,
                 exporter: Any | None = None) -> None:
        service_name = os.environ.get("OTEL_SERVICE_NAME", service_name)
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        if exporter is None:
            # A config endpoint is a base URL like OTEL_EXPORTER_OTLP_ENDPOINT: /v1/traces is added.
            endpoint = f"{otlp_endpoint.rstrip('/')}/v1/traces" if otlp_endpoint else None
            exporter = OTLPSpanExporter(endpoint=endpoint)
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
        self._tracer = self._provider.get_tracer("gateway")

    # --- ports.telemetry.Tracer --------------------------------------------------

    def start(self, name: str) -> _Span:
        return _Span(self._tracer.start_span(name, kind=SpanKind.INTERNAL))

    def start_client(self, name: str, attributes: Mapping[str, AttributeValue]) -> tuple[_Span, dict[str, str]]:
        """A client span for an upstream call, and the headers that carry it on."""
        span = self._tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        return _Span(span), headers

    # --- request observer -----------------------------------------------------------

    def request_started(self, record: RequestRecord, headers: list[tuple[bytes, bytes]]) -> object:
        parent = _PROPAGATOR.extract(headers, getter=_GETTER)
        span = self._tracer.start_span(
            f"{record.method} {record.route}", context=parent, kind=SpanKind.SERVER,
            attributes={"http.request.method": record.method, "http.route": record.route,
                        "gateway.surface": record.surface, "gateway.request_id": record.request_id},
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        return (span, token)

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        if handle is None:
            return
        span: trace.Span
        token: object
        span, token = handle  # type: ignore[misc]
        for key, value in _attributes(record):
            span.set_attribute(key, value)
        if record.status >= 500 or (record.error_kind is not None and record.status >= 500):
            span.set_status(Status(StatusCode.ERROR, record.error_kind or str(record.status)))
        span.end()
        otel_context.detach(token)  # type: ignore[arg-type]

    def shutdown(self) -> None:
        self._provider.shutdown()


def _attributes(record: RequestRecord) -> Iterable[tuple[str, AttributeValue]]:
    yield "http.response.status_code", record.status
    yield "gen_ai.operation.name", record.operation
    if record.model is not None:
        yield "gen_ai.request.model", record.model
    if record.upstream is not None:
        yield "gateway.upstream", record.upstream
    if record.finish_reason is not None:
        yield "gen_ai.response.finish_reasons", [record.finish_reason]  # type: ignore[misc]
    if record.input_tokens is not None:
        yield "gen_ai.usage.input_tokens", record.input_tokens
    if record.output_tokens is not None:
        yield "gen_ai.usage.output_tokens", record.output_tokens
    if record.error_kind is not None:
        yield "error.type", record.error_kind
    if record.session_id is not None:
        yield "session.id", record.session_id
    if record.consumer is not None:  # the key's consumer and non-secret id, never the key
        yield "gateway.consumer", record.consumer
    if record.key_id is not None:
        yield "gateway.key_id", record.key_id
    if record.client_gone:
        yield "gateway.client_gone", True
    yield "gateway.stream", record.stream
