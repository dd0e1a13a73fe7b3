"""How far a failed call got: every error the client raises carries its `FailureKind`, which
outlier ejection (`counts_against_replica`) and the one safe retry (`safe_to_retry`) read.

Real sockets on loopback: a raw asyncio server that answers each request with exact bytes, a
reset (RST), a close (FIN), or nothing at all; a port nobody listens on; a listener whose
backlog is full (the SYN is never answered: a connect that cannot finish)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Iterator

import pytest

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from domain.canonical import ChatRequest, Message, StreamError, TextPart
from domain.completions import CompletionRequest, EmbeddingRequest
from domain.errors import (
    GatewayError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from domain.upstream_failures import FailureKind, counts_against_replica, safe_to_retry

COMPLETION = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'
)


def http(status: str, body: bytes = b"", content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(), content_type, len(body), body)  # fmt: skip


class RawServer:
    """Each request gets `action`: bytes to write, "reset", "close", "hang", or "cut" (a 200 head
    and part of its body, then FIN)."""

    def __init__(self, action: bytes | str) -> None:
        self.action = action
        self.requests = 0
        self.url = ""
        self._hung: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                           if line.startswith(b"content-length:")), 0)  # fmt: skip
            await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.requests += 1
        action = self.action
        if action == "reset":
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        if action == "hang":
            self._hung.append(writer)  # never answered; closed at teardown
            return
        if action == "cut":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{")
        elif isinstance(action, bytes):
            writer.write(action)
        await writer.drain()
        writer.close()

    def close(self) -> None:
        for writer in self._hung:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[object]:
    listeners: list[asyncio.Server] = []
    servers: list[RawServer] = []

    async def start(action: bytes | str) -> RawServer:
        server = RawServer(action)
        listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        listeners.append(listener)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
    for listener in listeners:
        listener.close()


@pytest.fixture
def full_backlog() -> Iterator[str]:
    """A listener that never accepts, its backlog filled: a new connect gets no SYN-ACK."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # Linux keeps backlog + 1 established; the rest hang in SYN_SENT
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    yield f"http://127.0.0.1:{port}"
    for s in (*fillers, listener):
        s.close()


def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed on return: nobody listens


@pytest.fixture
async def calls() -> AsyncIterator[object]:
    sessions: list[object] = []

    def make(url: str, *, connect: float = 2.0, first_byte: float = 2.0) -> OpenAICompatClient:
        session = upstream_session(url)
        sessions.append(session)
        return OpenAICompatClient({"up": session}, name="up", base_url=url, connect_timeout=connect,
                                  first_byte_timeout=first_byte, idle_timeout=1.0)  # fmt: skip

    yield make
    for session in sessions:
        await session.close()  # type: ignore[attr-defined]


def request(stream: bool = False) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])], stream=stream)


async def failure_of(client: OpenAICompatClient, stream: bool) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        if stream:
            async with client.open_stream(request(stream=True)) as batches:
                async for _ in batches:
                    pass
        else:
            await client.complete(request())
    return caught.value


CASES = [
    # server action, error class (what the client sees, unchanged), kind, counts, safe to retry
    ("reset", UpstreamUnavailable, FailureKind.RESET_BEFORE_HEAD, True, True),
    ("close", UpstreamUnavailable, FailureKind.RESET_BEFORE_HEAD, True, True),
    (http("503 Service Unavailable"), UpstreamError, FailureKind.UNAVAILABLE, True, True),
    (http("503 Service Unavailable", b'{"error":{"message":"loading","code":503}}'), UpstreamError,
     FailureKind.UNAVAILABLE, True, True),
    (http("500 Internal Server Error", b'{"error":{"message":"boom"}}'), UpstreamError,
     FailureKind.SERVER_ERROR, True, False),
    (http("502 Bad Gateway"), UpstreamError, FailureKind.SERVER_ERROR, True, False),
    (b"NOT HTTP AT ALL\r\n\r\n", UpstreamProtocolError, FailureKind.MALFORMED_HEAD, True, False),
    (http("302 Found"), UpstreamProtocolError, FailureKind.MALFORMED_HEAD, True, False),
    ("cut", UpstreamError, FailureKind.AFTER_HEAD, False, False),
]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize(("action", "error", "kind", "counts", "retry"), CASES)
async def test_each_failure_names_how_far_the_call_got(
    serve: object, calls: object, action: bytes | str, error: type[GatewayError], kind: FailureKind,
    counts: bool, retry: bool, stream: bool,
) -> None:
    server = await serve(action)  # type: ignore[operator]
    exc = await failure_of(calls(server.url), stream)  # type: ignore[operator]
    if stream and action == "cut":  # a 200 JSON head to a stream: refused as not an event stream...
        error = UpstreamError  # ...after reading the body, which fails: the head was 2xx all the same
    assert type(exc) is error and exc.failure is kind
    assert counts_against_replica(exc.failure) is counts
    assert safe_to_retry(exc.failure) is retry
    assert server.requests == 1  # one send: a fresh connection that dies is never resent here


async def test_a_stream_cut_after_its_head_fails_in_stream_not_at_the_open(serve: object, calls: object) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    frame = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
             b'"delta":{"content":"o"}}]}\n\n')  # fmt: skip
    server = await serve(head + b"%x\r\n%s\r\n" % (len(frame), frame))  # then FIN, no last chunk  # type: ignore[operator]
    async with calls(server.url).open_stream(request(stream=True)) as batches:  # type: ignore[operator]
        events = [event async for batch in batches for chunk in batch for event in chunk.events]
    assert isinstance(events[-1], StreamError)  # the open succeeded: the replica answered with a 2xx head


async def test_a_timeout_after_the_request_was_sent_is_never_retried(serve: object, calls: object) -> None:
    server = await serve("hang")  # type: ignore[operator]
    for stream in (False, True):
        exc = await failure_of(calls(server.url, first_byte=0.3), stream)  # type: ignore[operator]
        assert isinstance(exc, UpstreamTimeout) and exc.failure is FailureKind.FIRST_BYTE_TIMEOUT
        assert counts_against_replica(exc.failure) and not safe_to_retry(exc.failure)
    assert server.requests == 2


async def test_connect_refused_is_a_connect_failure_safe_to_retry(calls: object) -> None:
    exc = await failure_of(calls(refused_url()), stream=False)  # type: ignore[operator]
    assert isinstance(exc, UpstreamUnavailable) and exc.failure is FailureKind.CONNECT
    assert exc.message == "upstream 'up' is unreachable"  # unchanged for the client
    assert counts_against_replica(exc.failure) and safe_to_retry(exc.failure)


async def test_a_connect_that_never_finishes_is_a_connect_failure(calls: object, full_backlog: str) -> None:
    by_connect_timeout = await failure_of(calls(full_backlog, connect=0.3), stream=False)  # type: ignore[operator]
    assert isinstance(by_connect_timeout, UpstreamTimeout) and by_connect_timeout.failure is FailureKind.CONNECT
    # the first-byte bound firing while still connecting: nothing was sent either
    by_first_byte = await failure_of(calls(full_backlog, connect=5, first_byte=0.3), stream=True)  # type: ignore[operator]
    assert isinstance(by_first_byte, UpstreamTimeout) and by_first_byte.failure is FailureKind.CONNECT
    assert safe_to_retry(by_first_byte.failure)


async def test_a_4xx_is_the_clients_fault_not_a_replica_failure(serve: object, calls: object) -> None:
    server = await serve(http("400 Bad Request", b'{"error":{"message":"bad","code":400}}'))  # type: ignore[operator]
    exc = await failure_of(calls(server.url), stream=False)  # type: ignore[operator]
    assert isinstance(exc, UpstreamRejected) and exc.status == 400 and exc.failure is None
    assert not counts_against_replica(exc.failure) and not safe_to_retry(exc.failure)


async def test_a_2xx_body_that_is_no_answer_failed_after_the_head(serve: object, calls: object) -> None:
    server = await serve(http("200 OK", b'{"id":"c","choices":[]}'))  # type: ignore[operator]
    exc = await failure_of(calls(server.url), stream=False)  # type: ignore[operator]
    assert isinstance(exc, UpstreamProtocolError) and exc.failure is FailureKind.AFTER_HEAD


async def test_a_healthy_answer_still_works(serve: object, calls: object) -> None:
    server = await serve(http("200 OK", COMPLETION))  # type: ignore[operator]
    answer = await calls(server.url).complete(request())  # type: ignore[operator]
    assert answer.content == [TextPart(text="ok")]


def test_the_retry_rule_never_retries_for_a_client_that_has_gone_or_an_answer_begun() -> None:
    for kind in FailureKind:
        assert not safe_to_retry(kind, client_gone=True)
        assert not safe_to_retry(kind, answer_started=True)
    assert {k for k in FailureKind if safe_to_retry(k)} == {
        FailureKind.CONNECT, FailureKind.RESET_BEFORE_HEAD, FailureKind.UNAVAILABLE,
    }  # fmt: skip
    assert not safe_to_retry(None) and not counts_against_replica(None)


PROXY_PAGE = (b"<html><body><h1>502 Bad Gateway</h1><p>upstream 10.42.7.13:8012 connection refused</p>"
              b"<hr>nginx/1.25.3</body></html>")
# server action, kind, the message the client sees (complete, stream): the failure's kind and the
# sanitized text both hold on every raise site (no upstream text reaches a client; the kinds replica
# ejection counts).
MESSAGES = [
    ("reset", FailureKind.RESET_BEFORE_HEAD, ("upstream 'up' is unreachable",) * 2),
    (http("503 Service Unavailable"), FailureKind.UNAVAILABLE, ("upstream 'up' answered HTTP 503",) * 2),
    (http("503 Service Unavailable", b'{"error":{"message":"loading","code":503}}'), FailureKind.UNAVAILABLE,
     ("loading",) * 2),
    (http("502 Bad Gateway", PROXY_PAGE, b"text/html"), FailureKind.SERVER_ERROR,
     ("upstream 'up' answered HTTP 502",) * 2),
    (http("500 Internal Server Error", b'{"detail":"Traceback ... /srv/app.py"}'), FailureKind.SERVER_ERROR,
     ("upstream 'up' answered HTTP 500",) * 2),
    (b"NOT HTTP AT ALL 10.42.7.13\r\n\r\n", FailureKind.MALFORMED_HEAD,
     ("upstream 'up' sent a malformed HTTP response",) * 2),
    (http("302 Found"), FailureKind.MALFORMED_HEAD, ("upstream 'up' answered HTTP 302",) * 2),
    ("cut", FailureKind.AFTER_HEAD, ("upstream 'up' connection failed mid-answer",) * 2),
]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize(("action", "kind", "messages"), MESSAGES)
async def test_each_failure_keeps_its_kind_and_its_sanitized_message(
    serve: object, calls: object, action: bytes | str, kind: FailureKind, messages: tuple[str, str], stream: bool,
) -> None:
    server = await serve(action)  # type: ignore[operator]
    exc = await failure_of(calls(server.url), stream)  # type: ignore[operator]
    assert exc.failure is kind
    assert exc.message == messages[stream]
    assert server.url.rsplit(":", 1)[1] not in exc.message  # the address stays in the log


async def test_a_stream_answered_with_a_page_is_malformed_and_shows_nothing_of_it(
    serve: object, calls: object
) -> None:
    server = await serve(http("200 OK", PROXY_PAGE, b"text/html"))  # type: ignore[operator]
    exc = await failure_of(calls(server.url), stream=True)  # type: ignore[operator]
    assert isinstance(exc, UpstreamProtocolError) and exc.failure is FailureKind.MALFORMED_HEAD
    assert exc.message == "upstream 'up' answered a stream request without an event stream"


async def _text_or_embedding_failure(client: OpenAICompatClient, operation: str) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        if operation == "text":
            await client.complete_text(CompletionRequest(model="m", prompt=["hi"]))
        elif operation == "text_stream":
            async with client.open_text_stream(CompletionRequest(model="m", prompt=["hi"], stream=True)) as batches:
                async for _ in batches:
                    pass
        else:
            await client.embed(EmbeddingRequest(model="m", inputs=["hi"]))
    return caught.value


@pytest.mark.parametrize("operation", ["text", "text_stream", "embed"])
@pytest.mark.parametrize(("action", "kind", "messages"), MESSAGES)
async def test_text_completions_and_embeddings_fail_the_same_way(
    serve: object, calls: object, action: bytes | str, kind: FailureKind, messages: tuple[str, str], operation: str,
) -> None:
    server = await serve(action)  # type: ignore[operator]
    exc = await _text_or_embedding_failure(calls(server.url), operation)  # type: ignore[operator]
    assert exc.failure is kind
    assert exc.message == messages[operation == "text_stream"]
