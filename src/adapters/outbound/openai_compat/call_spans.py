"""The client span of an upstream call (when tracing is on): started with the call's
GenAI attributes, its context sent in the request's headers, ended with the answer's
finish and usage or with the error's kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from yarl import URL

from domain.canonical import Usage
from domain.replicas import endpoint_of
from ports.telemetry import AttributeValue, Span


class ClientTracer(Protocol):
    """Starts an upstream-call span; returns it and the headers that carry its context."""

    def start_client(self, name: str, attributes: Mapping[str, AttributeValue]) -> tuple[Span, dict[str, str]]: ...


class CallSpans:
    """The spans of one upstream's calls; no span at all without a tracer."""

    __slots__ = ("_name", "_tracer")

    def __init__(self, tracer: ClientTracer | None, name: str) -> None:
        self._tracer = tracer
        self._name = name

    def start(
        self, operation: str, model: str, stream: bool, headers: dict[str, str], url: URL, replica: str | None
    ) -> tuple[Span | None, dict[str, str]]:
        """A client span for this call (when tracing is on) and headers carrying its context."""
        if self._tracer is None:
            return None, headers
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": operation, "gen_ai.request.model": model, "gateway.upstream": self._name,
            "server.address": url.host or "", "server.port": url.port or 0, "gen_ai.request.stream": stream,
        }  # fmt: skip
        if replica is not None:
            attributes["gateway.endpoint"] = endpoint_of(replica)
        span, carrier = self._tracer.start_client(f"{operation} {model}", attributes)
        return span, {**headers, **carrier}


def end_answered(span: Span | None, finish_reason: str, usage: Usage) -> None:
    if span is not None:
        span.set("gen_ai.response.finish_reasons", [finish_reason])  # type: ignore[arg-type]
        span.set("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set("gen_ai.usage.output_tokens", usage.output_tokens)
        span.end()


def end_span(span: Span | None, exc: BaseException | None) -> None:
    if span is not None:
        kind = getattr(exc, "kind", None) or (type(exc).__name__ if exc is not None else None)
        span.end(kind)
