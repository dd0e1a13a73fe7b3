"""`UpstreamClient`, `CompletionClient` and `EmbeddingClient` for one OpenAI-compatible server (vLLM), over aiohttp.

Each upstream address has one `aiohttp.ClientSession` (`session.py`), opened and closed
by the container; the client looks its session up by its upstream name on each call.
With `[endpoints]` a call names the replica its admission chose: it goes to that replica's
address on the replica's own session (`call_targets.py`). The exchange itself (the POST and
its one resend, the timeouts, failures as domain errors) is `transport.py`'s.

Any exit before a response body's end closes the response, so its connection is
closed instead of returned to the pool: that is how vLLM learns the client went away
and aborts the generation. A body read to its end gives the connection back for reuse.
A stream ends for its consumer as soon as `[DONE]` arrives (`chunk_stream.py`).

A streamed call is an `OpenStream` (`open_stream.py`). A context-length refusal (400) whose
prompt size is only a lower bound (vLLM stops counting past the limit) is corrected before it
is raised: the same server (the same replica) is asked its `/tokenize` count, within
`recount_timeout` (`prompt_counter.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager

import aiohttp
from yarl import URL

from domain.canonical import ChatRequest, ChatResponse, ChunkBatch
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.errors import ContextLengthExceeded, GatewayError
from domain.reasoning import has_budget
from domain.replicas import endpoint_of
from domain.resume import TokenTrail
from domain.upstream_failures import FailureKind
from ports.telemetry import AttributeValue, Span

from .call_spans import CallSpans, ClientTracer, end_answered, end_span
from .call_targets import CallTargets
from .chat_response import response_from_completion
from .chunk_stream import Mapper
from .completion_body import encode_completion, encode_embeddings
from .completion_mapping import TextStreamMapper, completion_from_body, embeddings_from_body
from .continuation import ContinuationMapper, encode_continuation
from .open_stream import OpenStream
from .prompt_counter import PromptCounter
from .replica_sessions import ReplicaSessions
from .request_body import encode_chat
from .stream_mapping import StreamMapper
from .trail_mapping import TrailStreamMapper, TrailTextMapper
from .transport import JSON_HEADERS, Transport

_CHAT, _COMPLETIONS, _EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
RECOUNT_TIMEOUT = 5.0  # seconds for the /tokenize count that corrects a refusal's lower bound


class OpenAICompatClient:
    """One upstream server; share one instance per upstream address."""

    __slots__ = (
        "_chat_url", "_completions_url", "_counter", "_embeddings_url", "_spans", "_targets", "_transport", "name",
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
        self._targets = CallTargets(sessions, name, ReplicaSessions() if replicas is None else replicas)
        self._transport = Transport(name, connect_timeout, first_byte_timeout, idle_timeout)
        self._spans = CallSpans(tracer, name)
        self._chat_url = URL(root + _CHAT)
        self._completions_url = URL(root + _COMPLETIONS)
        self._embeddings_url = URL(root + _EMBEDDINGS)
        self._counter = PromptCounter(self._transport, self._targets, root, recount_timeout)

    def __repr__(self) -> str:
        return f"OpenAICompatClient({self.name!r}, {str(self._chat_url.origin())!r})"

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        try:
            raw, span = await self._call(
                replica, _CHAT, self._chat_url, encode_chat(request, stream=False), "chat", request.model
            )
        except ContextLengthExceeded as exc:
            await self._counter.raise_counted(exc, request, replica)
            raise
        try:
            try:
                response = response_from_completion(raw)
            except GatewayError as exc:  # a 2xx head, then a body that is not an answer
                exc.failure = FailureKind.AFTER_HEAD
                raise
        except BaseException as exc:
            end_span(span, exc)
            raise
        end_answered(span, response.finish_reason, response.usage)
        return response

    def open_stream(
        self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None,
        trail: TokenTrail | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """A request with a thinking budget is opened up to its first batch, in which vLLM would
        refuse the budget (`reasoning_refusal`): the refusal is then raised while it opens. With
        a `trail`, vLLM is asked for token ids, which fill it (`trail_mapping`)."""
        if trail is not None:
            return self._open(
                replica, _CHAT, self._chat_url, encode_chat(request, stream=True, token_ids=True), "chat", request,
                TrailStreamMapper(trail), heartbeat, has_budget(request),
            )
        return self._open(
            replica, _CHAT, self._chat_url, encode_chat(request, stream=True), "chat", request, StreamMapper(),
            heartbeat, has_budget(request),
        )

    def open_continuation(
        self, request: ChatRequest | CompletionRequest, trail: TokenTrail, replica: str | None = None,
        heartbeat: float | None = None, resumed_from: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """The rest of `trail`'s broken answer, as a text completion of its token ids (`continuation`);
        its span records the resume (`gateway.stream.resume`)."""
        attributes: dict[str, AttributeValue] = {
            "gateway.resume.number": trail.resumes,
            "gateway.resume.tokens_sent_again": len(trail.continuation_prompt()),
        }
        if resumed_from is not None:
            attributes["gateway.resume.from_endpoint"] = endpoint_of(resumed_from)
        return self._open(
            replica, _COMPLETIONS, self._completions_url, encode_continuation(request, trail), "text_completion",
            request, ContinuationMapper(trail), heartbeat, event=("gateway.stream.resume", attributes),
        )

    async def complete_text(self, request: CompletionRequest, replica: str | None = None) -> Completion:
        try:
            raw, span = await self._call(
                replica, _COMPLETIONS, self._completions_url, encode_completion(request), "text_completion",
                request.model,
            )
        except ContextLengthExceeded as exc:
            await self._counter.raise_counted(exc, request, replica)
            raise
        try:
            try:
                answer = completion_from_body(raw)
            except GatewayError as exc:  # a 2xx head, then a body that is not an answer
                exc.failure = FailureKind.AFTER_HEAD
                raise
        except BaseException as exc:
            end_span(span, exc)
            raise
        end_answered(span, answer.finish_reason, answer.usage)
        return answer

    def open_text_stream(
        self, request: CompletionRequest, replica: str | None = None, trail: TokenTrail | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """With a `trail`, vLLM is asked for token ids, which fill it (`trail_mapping`)."""
        if trail is not None:
            return self._open(
                replica, _COMPLETIONS, self._completions_url, encode_completion(request, token_ids=True),
                "text_completion", request, TrailTextMapper(trail),
            )
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
            end_span(span, exc)
            raise
        if span is not None:
            span.set("gen_ai.usage.input_tokens", answer.usage.input_tokens)
            span.end()
        return answer

    async def _call(
        self, replica: str | None, path: str, default: URL, body: bytes, operation: str, model: str
    ) -> tuple[bytes, Span | None]:
        """A plain (non-streaming) call: the whole answer body and the open span, or the status's
        domain error (the span ended)."""
        session, url = self._targets.acquire(replica, path, default)
        span, headers = self._spans.start(operation, model, False, JSON_HEADERS, url, replica)
        transport = self._transport
        try:
            try:
                resp = await transport.post(session, url, body, headers)
                try:
                    await transport.check_status(resp)
                    return await transport.read_all(resp), span
                finally:
                    resp.close()  # no-op for the connection once the body was read to its end
            finally:
                if replica is not None:
                    self._targets.release(replica)
        except BaseException as exc:
            end_span(span, exc)
            raise

    def _open(
        self, replica: str | None, path: str, default: URL, body: bytes, operation: str,
        request: ChatRequest | CompletionRequest, mapper: Mapper, heartbeat: float | None = None, ahead: bool = False,
        event: tuple[str, Mapping[str, AttributeValue]] | None = None,
    ) -> OpenStream:
        return OpenStream(
            self._transport, self._targets, self._spans, self._counter, replica, path, default, body, operation,
            request, mapper, heartbeat, ahead, event,
        )

    async def count_tokens(self, request: ChatRequest) -> int:
        return await self._counter.count(request)
