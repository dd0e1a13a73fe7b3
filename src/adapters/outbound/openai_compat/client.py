"""`UpstreamClient` for one OpenAI-compatible server (vLLM), over aiohttp.

Each upstream address has one `aiohttp.ClientSession` (`session.py`), opened and closed
by the container; the client looks its session up by its upstream name on each call.

Three timeouts, because the wait for headers and the gaps between body reads need
different bounds (a non-streaming answer sends its headers only when generation is
done): `connect_timeout` bounds DNS, TCP and TLS connect (aiohttp's `connect` and
`sock_connect`), `first_byte_timeout` the wait for the response headers, `idle_timeout`
every single wait for more of the body.

Any exit before a response body's end closes the response, so its connection is
closed instead of returned to the pool: that is how vLLM learns the client went away
and aborts the generation. A body read to its end gives the connection back for reuse.
A stream ends for its consumer as soon as `[DONE]` arrives (`chunk_stream.py`).

A POST that meets a keep-alive connection the upstream closed or reset before the
answer's head arrived (the keep-alive race: the upstream never read it) is sent again,
once; aiohttp resends only idempotent methods itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Protocol

import aiohttp
import msgspec
from yarl import URL

from domain.canonical import ChatRequest, ChatResponse, ChunkBatch
from domain.errors import (
    NotSupported,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from ports.telemetry import AttributeValue, Span

from .chunk_stream import ChunkStream
from .context_errors import upstream_rejection
from .request_body import encode_chat, encode_tokenize
from .session import Attempt
from .stream_mapping import response_from_completion
from .wire import ERROR_DECODER, TOKENIZE_DECODER

log = logging.getLogger("gateway.upstream")


class ClientTracer(Protocol):
    """Starts an upstream-call span; returns it and the headers that carry its context."""

    def start_client(self, name: str, attributes: Mapping[str, AttributeValue]) -> tuple[Span, dict[str, str]]: ...

_JSON = {"Content-Type": "application/json", "Accept": "application/json", "Accept-Encoding": "identity"}
_SSE = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}


class OpenAICompatClient:
    """One upstream server; share one instance per upstream address."""

    __slots__ = (
        "_chat_url", "_first_byte", "_idle", "_sessions", "_timeout", "_tokenize_url", "_tracer", "name",
    )

    def __init__(
        self,
        sessions: Mapping[str, aiohttp.ClientSession],
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
        self._sessions = sessions  # this upstream's is `sessions[name]`, open while the app runs
        self._tracer = tracer
        self._chat_url = URL(root + "/v1/chat/completions")
        self._tokenize_url = URL(root + "/tokenize")
        # Per call: the first byte and each body read are bounded by our own timers below.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout)
        self._first_byte = first_byte_timeout
        self._idle = idle_timeout

    def __repr__(self) -> str:
        return f"OpenAICompatClient({self.name!r}, {str(self._chat_url.origin())!r})"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        body = encode_chat(request, stream=False)
        span, headers = self._client_span(request, _JSON)
        try:
            resp = await self._post(self._chat_url, body, headers)
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
             "gateway.upstream": self.name, "server.address": self._chat_url.host or "",
             "server.port": self._chat_url.port or 0, "gen_ai.request.stream": request.stream},
        )
        return span, {**headers, **carrier}

    @asynccontextmanager
    async def open_stream(self, request: ChatRequest) -> AsyncIterator[AsyncIterator[ChunkBatch]]:
        span, headers = self._client_span(request, _SSE)
        try:
            resp = await self._post(self._chat_url, encode_chat(request, stream=True), headers)
            stream = ChunkStream(resp, self._read)
            try:
                await self._check_status(resp)
                if resp.content_type != "text/event-stream":
                    await self._read_all(resp)
                    raise UpstreamProtocolError(f"upstream '{self.name}' answered a stream request without "
                                                "an event stream")
                yield stream
            finally:
                stream.close()
        except BaseException as exc:
            _end_span(span, exc)
            raise
        _end_span(span, None)

    async def count_tokens(self, request: ChatRequest) -> int:
        body = encode_tokenize(request)
        resp = await self._post(self._tokenize_url, body, _JSON)
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

    async def _post(self, url: URL, body: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """Send `body` and wait for the response headers; failures as domain errors.

        `request.request_id` is deliberately not sent as `X-Request-Id`: vLLM uses that
        header as its engine request id, and a client-chosen id reused by concurrent
        requests must not collide inside the engine.
        """
        try:
            async with asyncio.timeout(self._first_byte):
                return await self._send(url, body, headers)
        except aiohttp.ConnectionTimeoutError as exc:  # before TimeoutError: it is one
            raise UpstreamTimeout(f"upstream '{self.name}' connect timed out") from exc
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"upstream '{self.name}' sent no response within {self._first_byte:g}s"
            ) from exc
        except aiohttp.ClientConnectionError as exc:
            # aiohttp's text names the host and port: logged here, never shown to clients.
            log.warning("upstream %s unreachable: %s", self.name, exc)
            raise UpstreamUnavailable(f"upstream '{self.name}' is unreachable") from exc
        except aiohttp.ClientResponseError as exc:  # unparsable status line or headers
            # The parser's text quotes what the upstream sent: logged, never shown to clients.
            log.warning("upstream %s sent a malformed HTTP response: %s", self.name, exc)
            raise UpstreamProtocolError(f"upstream '{self.name}' sent a malformed HTTP response") from exc
        except aiohttp.ClientError as exc:
            log.warning("upstream %s request failed: %s", self.name, exc)
            raise UpstreamError(f"upstream '{self.name}' request failed") from exc

    async def _send(self, url: URL, body: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """One POST, sent again once if a reused connection died before the answer's head."""
        session = self._sessions[self.name]
        attempt = Attempt()
        try:
            return await session.post(
                url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False,
                trace_request_ctx=attempt,
            )
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if not attempt.reused or isinstance(exc, aiohttp.ClientConnectorError):
                raise
        return await session.post(
            url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False,
        )

    async def _read_all(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body, with `idle_timeout` bounding each wait for more."""
        parts = []
        while data := await self._read(resp):
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        """What arrived of the body since the last read (b"" at its end); failures as domain errors."""
        try:
            async with asyncio.timeout(self._idle):
                return await resp.content.readany()
        except TimeoutError as exc:
            raise UpstreamTimeout(f"upstream '{self.name}' sent nothing for {self._idle:g}s") from exc
        except aiohttp.ClientError as exc:
            # e.g. "ContentLengthError ... ConnectionResetError(104, ...)": logged, never shown.
            log.warning("upstream %s connection failed mid-answer: %r", self.name, exc)
            raise UpstreamError(f"upstream '{self.name}' connection failed mid-answer") from exc

    async def _check_status(self, resp: aiohttp.ClientResponse) -> None:
        """Raise the domain error for a non-2xx answer (the body carries the message)."""
        status = resp.status
        if 200 <= status < 300:
            return
        message = _error_message(await self._read_all(resp)) or f"upstream '{self.name}' answered HTTP {status}"
        if 400 <= status < 500:
            raise upstream_rejection(status, message)
        if status >= 500:
            raise UpstreamError(message)
        raise UpstreamProtocolError(f"upstream '{self.name}' answered HTTP {status}")


def _end_span(span: Span | None, exc: BaseException | None) -> None:
    if span is not None:
        kind = getattr(exc, "kind", None) or (type(exc).__name__ if exc is not None else None)
        span.end(kind)


def _error_message(raw: bytes) -> str | None:
    """The message of vLLM's nested or flat error envelope (cut at 500 characters), else None.

    Any other body (an ingress's HTML 502 naming a pod address and its server version, a
    proxy's text) is never shown to a client: the caller says "answered HTTP N" instead.
    """
    try:
        return ERROR_DECODER.decode(raw).error_message()
    except msgspec.DecodeError:
        return None
