"""`UpstreamClient`, `CompletionClient` and `EmbeddingClient` for one OpenAI-compatible server (vLLM), over aiohttp.

Each upstream address has one `aiohttp.ClientSession` (`session.py`), opened and closed
by the container; the client looks its session up by its upstream name on each call.
With `[endpoints]` a call names the replica its admission chose: it goes to that replica's
address on the replica's own session (`ReplicaSessions`).

Three timeouts, because the wait for headers and the gaps between body reads need
different bounds (a non-streaming answer sends its headers only when generation is
done): `connect_timeout` bounds DNS, TCP and TLS connect (aiohttp's `connect` and
`sock_connect`), `first_byte_timeout` the wait for the response headers (one loop timer
for all calls: `adapters/deadline.py`), `idle_timeout` every single wait for more of the body
(one lazy timer per response: `body_reader.py`).

Any exit before a response body's end closes the response, so its connection is
closed instead of returned to the pool: that is how vLLM learns the client went away
and aborts the generation. A body read to its end gives the connection back for reuse.
A stream ends for its consumer as soon as `[DONE]` arrives (`chunk_stream.py`).

A POST that meets a keep-alive connection the upstream closed or reset before the
answer's head arrived (the keep-alive race: the upstream never read it) is sent again,
once, to the same replica; aiohttp resends only idempotent methods itself.

Every error raised for a failed call carries how far the call got
(`GatewayError.failure`, a `domain.upstream_failures.FailureKind`), which outlier
ejection and the one safe retry to another replica read; the error's class, status and
message (what the client sees) do not depend on it.

A context-length refusal (400) whose prompt size is only a lower bound (vLLM stops counting
past the limit) is corrected before it is raised: the same server (the same replica) is asked
its `/tokenize` count, within `recount_timeout` (`token_count.py`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol

import aiohttp
import msgspec
from yarl import URL

from adapters.deadline import Deadlines
from domain.canonical import ChatRequest, ChatResponse, ChunkBatch, Usage
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.errors import (
    ContextLengthExceeded,
    GatewayError,
    NotSupported,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from domain.reasoning import has_budget
from domain.replicas import endpoint_of
from domain.upstream_failures import FailureKind
from ports.telemetry import AttributeValue, Span

from .body_reader import BodyReader
from .chat_response import response_from_completion
from .chunk_stream import ChunkStream, Mapper
from .completion_body import encode_completion, encode_embeddings
from .completion_mapping import TextStreamMapper, completion_from_body, embeddings_from_body
from .context_errors import upstream_rejection
from .reasoning_refusal import ReadAhead, read_ahead
from .replica_sessions import ReplicaSessions
from .request_body import encode_chat
from .session import CURRENT_ATTEMPT, Attempt
from .stream_mapping import StreamMapper
from .token_count import APPLY_TEMPLATE, TOKENIZE, count_chat, recount
from .wire import ERROR_DECODER

log = logging.getLogger("gateway.upstream")


class ClientTracer(Protocol):
    """Starts an upstream-call span; returns it and the headers that carry its context."""

    def start_client(self, name: str, attributes: Mapping[str, AttributeValue]) -> tuple[Span, dict[str, str]]: ...

_JSON = {"Content-Type": "application/json", "Accept": "application/json", "Accept-Encoding": "identity"}
_SSE = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}
_CHAT, _COMPLETIONS, _EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
RECOUNT_TIMEOUT = 5.0  # seconds for the /tokenize count that corrects a refusal's lower bound


class OpenAICompatClient:
    """One upstream server; share one instance per upstream address."""

    __slots__ = (
        "_chat_url", "_completions_url", "_deadlines", "_embeddings_url", "_first_byte", "_helper_urls", "_idle",
        "_recount_timeout", "_replica_urls", "_replicas", "_sessions", "_timeout", "_tracer", "name",
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
        replicas: ReplicaSessions | None = None,
        recount_timeout: float = RECOUNT_TIMEOUT,
    ) -> None:
        root = base_url.rstrip("/")
        self.name = name
        self._sessions = sessions  # this upstream's is `sessions[name]`, open while the app runs
        self._replicas = ReplicaSessions() if replicas is None else replicas  # [endpoints]: a session per replica
        self._replica_urls: dict[tuple[str, str], URL] = {}  # (replica base URL, path) -> its URL
        self._tracer = tracer
        self._chat_url = URL(root + _CHAT)
        self._completions_url = URL(root + _COMPLETIONS)
        self._embeddings_url = URL(root + _EMBEDDINGS)
        self._helper_urls = {path: URL(root + path) for path in (TOKENIZE, APPLY_TEMPLATE)}
        self._recount_timeout = recount_timeout
        # Per call: the first byte and each body read are bounded by our own timers below.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_connect=connect_timeout)
        self._first_byte = first_byte_timeout
        self._deadlines = Deadlines(first_byte_timeout)  # the head waits of every call share one timer
        self._idle = idle_timeout

    def __repr__(self) -> str:
        return f"OpenAICompatClient({self.name!r}, {str(self._chat_url.origin())!r})"

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        try:
            raw, span = await self._call(
                replica, _CHAT, self._chat_url, encode_chat(request, stream=False), "chat", request.model
            )
        except ContextLengthExceeded as exc:
            await self._raise_counted(exc, request, replica)
            raise
        try:
            try:
                response = response_from_completion(raw)
            except GatewayError as exc:  # a 2xx head, then a body that is not an answer
                exc.failure = FailureKind.AFTER_HEAD
                raise
        except BaseException as exc:
            _end_span(span, exc)
            raise
        _end_answered(span, response.finish_reason, response.usage)
        return response

    def open_stream(
        self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """A request with a thinking budget is opened up to its first batch, in which vLLM would
        refuse the budget (`reasoning_refusal`): the refusal is then raised while it opens."""
        return self._open(
            replica, _CHAT, self._chat_url, encode_chat(request, stream=True), "chat", request, StreamMapper(),
            heartbeat, has_budget(request),
        )

    async def complete_text(self, request: CompletionRequest, replica: str | None = None) -> Completion:
        try:
            raw, span = await self._call(
                replica, _COMPLETIONS, self._completions_url, encode_completion(request), "text_completion",
                request.model,
            )
        except ContextLengthExceeded as exc:
            await self._raise_counted(exc, request, replica)
            raise
        try:
            try:
                answer = completion_from_body(raw)
            except GatewayError as exc:  # a 2xx head, then a body that is not an answer
                exc.failure = FailureKind.AFTER_HEAD
                raise
        except BaseException as exc:
            _end_span(span, exc)
            raise
        _end_answered(span, answer.finish_reason, answer.usage)
        return answer

    def open_text_stream(
        self, request: CompletionRequest, replica: str | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        return self._open(
            replica, _COMPLETIONS, self._completions_url, encode_completion(request), "text_completion",
            request, TextStreamMapper(),
        )

    async def embed(self, request: EmbeddingRequest, replica: str | None = None) -> Embeddings:
        raw, span = await self._call(
            replica, _EMBEDDINGS, self._embeddings_url, encode_embeddings(request), "embeddings", request.model
        )
        try:
            try:
                answer = embeddings_from_body(raw)
            except GatewayError as exc:  # a 2xx head, then a body that is not an answer
                exc.failure = FailureKind.AFTER_HEAD
                raise
        except BaseException as exc:
            _end_span(span, exc)
            raise
        if span is not None:
            span.set("gen_ai.usage.input_tokens", answer.usage.input_tokens)
            span.end()
        return answer

    def _target(self, replica: str | None, path: str, default: URL) -> tuple[aiohttp.ClientSession, URL]:
        """The session and URL of this call: the upstream's, or the chosen replica's.

        A replica's session is acquired here: the caller releases it when the call is over.
        """
        if replica is None:
            return self._sessions[self.name], default
        url = self._replica_urls.get((replica, path))
        if url is None:
            if len(self._replica_urls) >= 1024:  # replicas come and go with DNS: stay bounded
                self._replica_urls.clear()
            url = self._replica_urls[replica, path] = URL(replica.rstrip("/") + path)
        return self._replicas.acquire(replica), url

    def _client_span(
        self, operation: str, model: str, stream: bool, headers: dict[str, str], url: URL, replica: str | None
    ) -> tuple[Span | None, dict[str, str]]:
        """A client span for this call (when tracing is on) and headers carrying its context."""
        if self._tracer is None:
            return None, headers
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": operation, "gen_ai.request.model": model, "gateway.upstream": self.name,
            "server.address": url.host or "", "server.port": url.port or 0, "gen_ai.request.stream": stream,
        }  # fmt: skip
        if replica is not None:
            attributes["gateway.endpoint"] = endpoint_of(replica)
        span, carrier = self._tracer.start_client(f"{operation} {model}", attributes)
        return span, {**headers, **carrier}

    async def _call(
        self, replica: str | None, path: str, default: URL, body: bytes, operation: str, model: str
    ) -> tuple[bytes, Span | None]:
        """A plain (non-streaming) call: the whole answer body and the open span, or the status's
        domain error (the span ended)."""
        session, url = self._target(replica, path, default)
        span, headers = self._client_span(operation, model, False, _JSON, url, replica)
        try:
            try:
                resp = await self._post(session, url, body, headers)
                try:
                    await self._check_status(resp)
                    return await self._read_all(resp), span
                finally:
                    resp.close()  # no-op for the connection once the body was read to its end
            finally:
                if replica is not None:
                    self._replicas.release(replica)
        except BaseException as exc:
            _end_span(span, exc)
            raise

    def _open(
        self, replica: str | None, path: str, default: URL, body: bytes, operation: str,
        request: ChatRequest | CompletionRequest, mapper: Mapper, heartbeat: float | None = None, ahead: bool = False,
    ) -> _OpenStream:
        return _OpenStream(self, replica, path, default, body, operation, request, mapper, heartbeat, ahead)

    async def count_tokens(self, request: ChatRequest) -> int:
        return await count_chat(self._ask, request)

    async def _raise_counted(
        self, error: ContextLengthExceeded, request: ChatRequest | CompletionRequest, replica: str | None
    ) -> None:
        """Raise `error` with its prompt's real size when it had only a lower bound and the
        server counted it; return (the caller re-raises `error`) otherwise."""
        if error.exact:
            return
        counted = await recount(self._ask, error, request, replica, self._recount_timeout)
        if counted is not error:
            raise counted from error

    async def _ask(self, replica: str | None, path: str, body: bytes) -> bytes:
        """One call of a helper endpoint (`/tokenize`, `/apply-template`) on the upstream or the
        replica: the answer's body; a 404 is `NotSupported`, another failure its domain error."""
        session, url = self._target(replica, path, self._helper_urls[path])
        try:
            resp = await self._post(session, url, body, _JSON)
            try:
                if resp.status == 404:
                    raise NotSupported(f"upstream has no {path}")
                await self._check_status(resp)
                return await self._read_all(resp)
            finally:
                resp.close()
        finally:
            if replica is not None:
                self._replicas.release(replica)

    # --- transport -------------------------------------------------------------------

    async def _post(
        self, session: aiohttp.ClientSession, url: URL, body: bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """Send `body` and wait for the response headers; failures as domain errors.

        `request.request_id` is deliberately not sent as `X-Request-Id`: vLLM uses that
        header as its engine request id, and a client-chosen id reused by concurrent
        requests must not collide inside the engine.
        """
        attempt = Attempt()
        try:
            with self._deadlines.start():  # asyncio.timeout's rule on one shared timer (adapters/deadline.py)
                return await self._send(session, url, body, headers, attempt)
        except aiohttp.ConnectionTimeoutError as exc:  # before TimeoutError: it is one
            raise UpstreamTimeout(f"upstream '{self.name}' connect timed out", failure=FailureKind.CONNECT) from exc
        except TimeoutError as exc:
            # Sent: the replica may be generating. Not sent: the connect never finished.
            kind = FailureKind.FIRST_BYTE_TIMEOUT if attempt.sent else FailureKind.CONNECT
            raise UpstreamTimeout(
                f"upstream '{self.name}' sent no response within {self._first_byte:g}s", failure=kind
            ) from exc
        except aiohttp.ClientConnectionError as exc:
            # aiohttp's text names the host and port: logged here, never shown to clients.
            log.warning("upstream %s unreachable: %s", self.name, exc)
            # Refused, unreachable, DNS, TLS: never reached. Otherwise the connection was made and
            # died (reset, closed) before the answer's head.
            connect = isinstance(exc, aiohttp.ClientConnectorError)
            kind = FailureKind.CONNECT if connect else FailureKind.RESET_BEFORE_HEAD
            raise UpstreamUnavailable(f"upstream '{self.name}' is unreachable", failure=kind) from exc
        except aiohttp.ClientResponseError as exc:  # unparsable status line or headers
            # The parser's text quotes what the upstream sent: logged, never shown to clients.
            log.warning("upstream %s sent a malformed HTTP response: %s", self.name, exc)
            raise UpstreamProtocolError(
                f"upstream '{self.name}' sent a malformed HTTP response", failure=FailureKind.MALFORMED_HEAD
            ) from exc
        except aiohttp.ClientError as exc:  # none of the above: not classified, so never retried
            log.warning("upstream %s request failed: %s", self.name, exc)
            raise UpstreamError(f"upstream '{self.name}' request failed") from exc

    async def _send(
        self, session: aiohttp.ClientSession, url: URL, body: bytes, headers: dict[str, str], attempt: Attempt
    ) -> aiohttp.ClientResponse:
        """One POST, sent again once (to the same address) if a reused connection died before the answer's head."""
        token = CURRENT_ATTEMPT.set(attempt)  # the session's connector marks it (session.py)
        try:
            try:
                return await session.post(
                    url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if not attempt.reused or isinstance(exc, aiohttp.ClientConnectorError):
                    raise
            attempt.sent = False  # the resend is a new attempt (never reused: `reused` is not read again)
            return await session.post(url, data=body, headers=headers, timeout=self._timeout, allow_redirects=False)
        finally:
            CURRENT_ATTEMPT.reset(token)

    async def _read_all(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body, with `idle_timeout` bounding each wait for more (`BodyReader`)."""
        content = resp.content
        if content.is_eof() and content.exception() is None:
            # It all came with the head (most short answers): nothing to wait for, so no timer.
            return content.read_nowait()
        reader = BodyReader(resp, self._idle, self.name)
        try:
            parts = []
            while data := await reader.read():
                parts.append(data)
        finally:
            reader.close()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _check_status(self, resp: aiohttp.ClientResponse) -> None:
        """Raise the domain error for a non-2xx answer (the body carries the message)."""
        status = resp.status
        if 200 <= status < 300:
            return
        kind = FailureKind.UNAVAILABLE if status == 503 else FailureKind.SERVER_ERROR
        try:
            message = _error_message(await self._read_all(resp)) or f"upstream '{self.name}' answered HTTP {status}"
        except GatewayError as exc:
            if status >= 500:  # the head already said what failed; the error body is only its text
                exc.failure = kind
            raise
        if 400 <= status < 500:
            raise upstream_rejection(status, message)
        if status >= 500:
            raise UpstreamError(message, failure=kind)
        raise UpstreamProtocolError(
            f"upstream '{self.name}' answered HTTP {status}", failure=FailureKind.MALFORMED_HEAD
        )


class _OpenStream:
    """A streamed call as an async context manager (a class: an `asynccontextmanager` costs a
    generator, its wrapper and the loop's bookkeeping of async generators per stream).
    Entering sends the request and checks the head: the `ChunkStream`; leaving closes the
    response (an early exit aborts the generation upstream), gives the replica's session back
    and ends the span. With `ahead`, entering also reads the first batch (`read_ahead`)."""

    __slots__ = ("_args", "_client", "_replica", "_request", "_span", "_stream")

    def __init__(
        self, client: OpenAICompatClient, replica: str | None, path: str, default: URL, body: bytes,
        operation: str, request: ChatRequest | CompletionRequest, mapper: Mapper, heartbeat: float | None,
        ahead: bool = False,
    ) -> None:
        self._client = client
        self._replica = replica
        self._request = request
        self._args = (path, default, body, operation, request.model, mapper, heartbeat, ahead)
        self._span: Span | None = None
        self._stream: ChunkStream | ReadAhead | None = None

    async def __aenter__(self) -> ChunkStream | ReadAhead:
        client, replica = self._client, self._replica
        path, default, body, operation, model, mapper, heartbeat, ahead = self._args
        session, url = client._target(replica, path, default)
        span, headers = client._client_span(operation, model, True, _SSE, url, replica)
        self._span = span
        try:
            try:
                resp = await client._post(session, url, body, headers)
                stream = ChunkStream(resp, BodyReader(resp, client._idle, client.name, heartbeat), mapper)
                try:
                    await client._check_status(resp)
                    if not _is_event_stream(resp.headers.get("Content-Type", "")):
                        await client._read_all(resp)
                        raise UpstreamProtocolError(
                            f"upstream '{client.name}' answered a stream request without an event stream",
                            failure=FailureKind.MALFORMED_HEAD,
                        )
                    opened: ChunkStream | ReadAhead = await read_ahead(stream) if ahead else stream
                except BaseException:
                    stream.close()
                    raise
            except BaseException:
                if replica is not None:
                    client._replicas.release(replica)
                raise
        except BaseException as exc:
            _end_span(span, exc)
            if isinstance(exc, ContextLengthExceeded):
                await client._raise_counted(exc, self._request, replica)
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
                    self._client._replicas.release(self._replica)
        except BaseException as error:
            _end_span(self._span, error)
            raise
        _end_span(self._span, exc)


def _is_event_stream(content_type: str) -> bool:
    """The header's media type is `text/event-stream` (aiohttp's `content_type` parses the
    whole header, parameters and all, into a new object per response: only this is needed)."""
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"


def _end_answered(span: Span | None, finish_reason: str, usage: Usage) -> None:
    if span is not None:
        span.set("gen_ai.response.finish_reasons", [finish_reason])  # type: ignore[arg-type]
        span.set("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set("gen_ai.usage.output_tokens", usage.output_tokens)
        span.end()


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
