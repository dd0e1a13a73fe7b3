"""`UpstreamClient` for one OpenAI-compatible server (vLLM), over `adapters.outbound.http_pool`.

Three timeouts, because the wait for headers and the gaps between body reads need
different bounds (a non-streaming answer sends its headers only when generation is
done): `connect_timeout` bounds DNS and TCP connect, `first_byte_timeout` the wait for
the response headers, `idle_timeout` every single wait for more of the body.

Any exit before a response body's end closes the connection instead of returning
it to the pool: that is how vLLM learns the client went away and aborts the
generation. A body read to its end gives the connection back for reuse.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol
from urllib.parse import urlsplit

import msgspec

from adapters.outbound.http_pool import (
    ConnectFailed,
    ConnectionBroken,
    ConnectTimedOut,
    HttpPool,
    MalformedResponse,
    Response,
    ResponseTimedOut,
    TransportError,
)
from domain.canonical import ChatRequest, ChatResponse, ChunkBatch, StreamChunk
from domain.errors import (
    NotSupported,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from ports.telemetry import AttributeValue, Span

from .context_errors import upstream_rejection
from .request_body import encode_chat, encode_tokenize
from .sse_decoder import SseDecoder, SseOverflow
from .stream_mapping import Phase, StreamMapper, response_from_completion
from .wire import ERROR_DECODER, TOKENIZE_DECODER

log = logging.getLogger("gateway.upstream")


class ClientTracer(Protocol):
    """Starts an upstream-call span; returns it and the headers that carry its context."""

    def start_client(self, name: str, attributes: Mapping[str, AttributeValue]) -> tuple[Span, dict[str, str]]: ...

_JSON = {"Content-Type": "application/json", "Accept": "application/json"}
_SSE = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_DRAIN_TIMEOUT = 1.0  # after [DONE], how long to wait for the body's end (pool reuse)


class OpenAICompatClient:
    """One upstream server; share one instance per upstream address."""

    __slots__ = ("_chat_path", "_first_byte", "_idle", "_pool", "_tokenize_path", "_tracer", "name")

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        connect_timeout: float = 10.0,
        first_byte_timeout: float = 600.0,
        idle_timeout: float = 120.0,
        tracer: ClientTracer | None = None,
    ) -> None:
        root = base_url.rstrip("/")
        self.name = name
        self._tracer = tracer
        self._pool = HttpPool(root, connect_timeout=connect_timeout)
        base_path = urlsplit(root).path
        self._chat_path = base_path + "/v1/chat/completions"
        self._tokenize_path = base_path + "/tokenize"
        self._first_byte = first_byte_timeout
        self._idle = idle_timeout

    def __repr__(self) -> str:
        return f"OpenAICompatClient({self.name!r}, {self._pool.origin!r})"

    def close(self) -> None:
        """Close the idle pooled connections (at shutdown)."""
        self._pool.close()

    async def complete(self, request: ChatRequest) -> ChatResponse:
        body = encode_chat(request, stream=False)
        span, headers = self._client_span(request, _JSON)
        try:
            resp = await self._post(self._chat_path, body, headers)
            try:
                await self._check_status(resp)
                raw = await self._read_all(resp)
            finally:
                resp.close()  # no-op for the connection once the body was read to its end
            response = response_from_completion(raw)
        except BaseException as exc:
            _end_span(span, exc)
            raise
        if span is not None:
            span.set("gen_ai.response.finish_reasons", [response.finish_reason])  # type: ignore[arg-type]
            span.set("gen_ai.usage.input_tokens", response.usage.input_tokens)
            span.set("gen_ai.usage.output_tokens", response.usage.output_tokens)
            span.end()
        return response

    def _client_span(self, request: ChatRequest, headers: dict[str, str]) -> tuple[Span | None, dict[str, str]]:
        """A client span for this call (when tracing is on) and headers carrying its context."""
        if self._tracer is None:
            return None, headers
        span, carrier = self._tracer.start_client(
            f"chat {request.model}",
            {"gen_ai.operation.name": "chat", "gen_ai.request.model": request.model,
             "gateway.upstream": self.name, "server.address": self._pool.host,
             "server.port": self._pool.port, "gen_ai.request.stream": request.stream},
        )
        return span, {**headers, **carrier}

    def open_stream(self, request: ChatRequest) -> _StreamContext:
        return _StreamContext(self, request)

    async def count_tokens(self, request: ChatRequest) -> int:
        body = encode_tokenize(request)
        resp = await self._post(self._tokenize_path, body, _JSON)
        try:
            if resp.status == 404:
                raise NotSupported("upstream has no /tokenize")
            await self._check_status(resp)
            raw = await self._read_all(resp)
        finally:
            resp.close()
        try:
            return TOKENIZE_DECODER.decode(raw).count
        except msgspec.DecodeError as exc:
            raise UpstreamProtocolError(f"malformed /tokenize answer: {exc}") from None

    # --- transport -------------------------------------------------------------------

    async def _post(self, path: str, body: bytes, headers: dict[str, str]) -> Response:
        """Send `body` and wait for the response headers; failures as domain errors.

        `request.request_id` is deliberately not sent as `X-Request-Id`: vLLM uses that
        header as its engine request id, and a client-chosen id reused by concurrent
        requests must not collide inside the engine.
        """
        try:
            return await self._pool.request("POST", path, headers, body, self._first_byte)
        except ConnectTimedOut as exc:
            raise UpstreamTimeout(f"upstream '{self.name}' connect timed out") from exc
        except ResponseTimedOut as exc:
            raise UpstreamTimeout(
                f"upstream '{self.name}' sent no response within {self._first_byte:g}s"
            ) from exc
        except (ConnectFailed, ConnectionBroken) as exc:
            # The transport's text names the host and port: logged here, never shown to clients.
            log.warning("upstream %s unreachable: %s", self.name, exc)
            raise UpstreamUnavailable(f"upstream '{self.name}' is unreachable") from exc
        except MalformedResponse as exc:  # unparsable status line or headers
            raise UpstreamProtocolError(f"upstream '{self.name}' sent a {exc}") from exc

    async def _read_all(self, resp: Response) -> bytes:
        """The whole body, with `idle_timeout` bounding each wait for more."""
        try:
            return await resp.read_all(self._idle)
        except ResponseTimedOut as exc:
            raise UpstreamTimeout(self._stalled()) from exc
        except TransportError as exc:
            raise UpstreamError(self._broken(exc)) from exc

    async def _check_status(self, resp: Response) -> None:
        """Raise the domain error for a non-2xx answer (the body carries the message)."""
        status = resp.status
        if 200 <= status < 300:
            return
        message = _error_message(await self._read_all(resp))
        if 400 <= status < 500:
            raise upstream_rejection(status, message or f"upstream answered HTTP {status}")
        if status >= 500:
            raise UpstreamError(message or f"upstream '{self.name}' answered HTTP {status}")
        raise UpstreamProtocolError(f"upstream '{self.name}' answered HTTP {status}")

    def _stalled(self) -> str:
        return f"upstream '{self.name}' sent nothing for {self._idle:g}s"

    def _broken(self, exc: BaseException) -> str:
        return f"upstream '{self.name}' connection failed mid-answer: {exc}"


def _end_span(span: Span | None, exc: BaseException | None) -> None:
    if span is not None:
        kind = getattr(exc, "kind", None) or (type(exc).__name__ if exc is not None else None)
        span.end(kind)


def _error_message(raw: bytes) -> str | None:
    """The message of vLLM's nested or flat error envelope, else the body's text."""
    try:
        message = ERROR_DECODER.decode(raw).error_message()
    except msgspec.DecodeError:
        message = None
    return message or raw.decode("utf-8", "replace").strip()[:500] or None


class _StreamContext(AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]):
    """What `open_stream` returns: entering sends and checks; leaving closes."""

    __slots__ = ("_client", "_request", "_span", "_stream")

    def __init__(self, client: OpenAICompatClient, request: ChatRequest) -> None:
        self._client = client
        self._request = request
        self._stream: _ChunkStream | None = None
        self._span: Span | None = None

    async def __aenter__(self) -> AsyncIterator[ChunkBatch]:
        client, request = self._client, self._request
        body = encode_chat(request, stream=True)
        self._span, headers = client._client_span(request, _SSE)
        try:
            resp = await client._post(client._chat_path, body, headers)
        except BaseException as exc:
            _end_span(self._span, exc)
            raise
        try:
            await client._check_status(resp)
            if resp.content_type != "text/event-stream":
                message = _error_message(await client._read_all(resp))
                raise UpstreamProtocolError(
                    f"upstream '{client.name}' answered {resp.content_type}, not an event stream: {message}"
                )
        except BaseException as exc:
            resp.close()
            _end_span(self._span, exc)
            raise
        self._stream = _ChunkStream(client, resp)
        return self._stream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stream is not None:
            self._stream.close()
            _end_span(self._span, exc)


class _ChunkStream:
    """Async iterator of one response's chunks. Mid-stream failures become a final
    `StreamError` chunk, never an exception: the client has already had its 200."""

    __slots__ = ("_client", "_decoder", "_eof", "_mapper", "_pending", "_resp")

    def __init__(self, client: OpenAICompatClient, resp: Response) -> None:
        self._client = client
        self._resp = resp
        self._decoder = SseDecoder()
        self._mapper = StreamMapper()
        self._pending: ChunkBatch = []
        self._eof = False

    def __aiter__(self) -> _ChunkStream:
        return self

    async def __anext__(self) -> ChunkBatch:
        while not self._pending:
            if self._eof or self._mapper.phase is Phase.FAILED:
                raise StopAsyncIteration
            await self._read()
        batch, self._pending = self._pending, []
        return batch

    def close(self) -> None:
        """Abort unless the body was read to its end (then the pool already has it)."""
        self._eof = True
        self._resp.close()

    async def _read(self) -> None:
        mapper, client = self._mapper, self._client
        timeout = client._idle if not mapper.ended else min(client._idle, _DRAIN_TIMEOUT)
        try:
            data = await self._resp.read(timeout)
        except ResponseTimedOut:
            self._end(mapper.fail(UpstreamTimeout(client._stalled())))
            return
        except TransportError as exc:
            self._end(mapper.fail(UpstreamError(client._broken(exc))))
            return
        if not data:
            self._end(mapper.close())
            return
        try:
            payloads = self._decoder.feed(data)
        except SseOverflow as exc:
            self._end(mapper.fail(UpstreamProtocolError(str(exc))))
            return
        for payload in payloads:
            chunk = mapper.feed(payload)
            if chunk is not None:
                self._pending.append(chunk)
                if mapper.phase is Phase.FAILED:
                    return

    def _end(self, last: StreamChunk | None) -> None:
        self._eof = True
        if last is not None:
            self._pending.append(last)
