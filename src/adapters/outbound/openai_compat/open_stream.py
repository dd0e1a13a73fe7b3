"""A streamed upstream call as an async context manager.

A class, not an `asynccontextmanager`: that costs a generator, its wrapper and the loop's
bookkeeping of async generators per stream. Entering sends the request and checks the head:
the `ChunkStream`; leaving closes the response (an early exit aborts the generation
upstream), gives the replica's session back and ends the span. With `ahead`, entering also
reads the first batch (`read_ahead`), in which vLLM would refuse a thinking budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from yarl import URL

from domain.canonical import ChatRequest
from domain.completions import CompletionRequest
from domain.errors import ContextLengthExceeded, UpstreamProtocolError
from domain.upstream_failures import FailureKind
from ports.telemetry import AttributeValue, Span

from .call_spans import CallSpans, end_span
from .call_targets import CallTargets
from .chunk_stream import ChunkStream, Mapper
from .prompt_counter import PromptCounter
from .reasoning_refusal import ReadAhead, read_ahead
from .transport import SSE_HEADERS, Transport, is_event_stream


class OpenStream:
    """One streamed call of an upstream (its `transport`, `targets`, `spans` and `counter`)."""

    __slots__ = ("_args", "_counter", "_event", "_replica", "_request", "_span", "_spans", "_stream", "_targets",
                 "_transport")  # fmt: skip

    def __init__(
        self, transport: Transport, targets: CallTargets, spans: CallSpans, counter: PromptCounter,
        replica: str | None, path: str, default: URL, body: bytes, operation: str,
        request: ChatRequest | CompletionRequest, mapper: Mapper, heartbeat: float | None, ahead: bool = False,
        event: tuple[str, Mapping[str, AttributeValue]] | None = None,
    ) -> None:
        """`event`: a span event recorded on the call's span as it starts (a resume's)."""
        self._transport = transport
        self._targets = targets
        self._spans = spans
        self._counter = counter
        self._replica = replica
        self._request = request
        self._args = (path, default, body, operation, request.model, mapper, heartbeat, ahead)
        self._event = event
        self._span: Span | None = None
        self._stream: ChunkStream | ReadAhead | None = None

    async def __aenter__(self) -> ChunkStream | ReadAhead:
        transport, replica = self._transport, self._replica
        path, default, body, operation, model, mapper, heartbeat, ahead = self._args
        session, url = self._targets.acquire(replica, path, default)
        span, headers = self._spans.start(operation, model, True, SSE_HEADERS, url, replica)
        self._span = span
        if span is not None and self._event is not None:
            span.event(*self._event)
        try:
            try:
                resp = await transport.post(session, url, body, headers)
                stream = ChunkStream(resp, transport.body_reader(resp, heartbeat), mapper)
                try:
                    await transport.check_status(resp)
                    if not is_event_stream(resp.headers.get("Content-Type", "")):
                        await transport.read_all(resp)
                        raise UpstreamProtocolError(
                            f"upstream '{transport.name}' answered a stream request without an event stream",
                            failure=FailureKind.MALFORMED_HEAD,
                        )
                    opened: ChunkStream | ReadAhead = await read_ahead(stream) if ahead else stream
                except BaseException:
                    stream.close()
                    raise
            except BaseException:
                if replica is not None:
                    self._targets.release(replica)
                raise
        except BaseException as exc:
            end_span(span, exc)
            if isinstance(exc, ContextLengthExceeded):
                await self._counter.raise_counted(exc, self._request, replica)
            raise
        self._stream = opened
        return opened

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._stream is not None
        try:
            try:
                self._stream.close()
            finally:
                if self._replica is not None:
                    self._targets.release(self._replica)
        except BaseException as error:
            end_span(self._span, error)
            raise
        end_span(self._span, exc)
