"""The input limits through a real gateway: each violation is a clear 4xx in the surface's
own shape (never a 500), and the server's protocol bounds what a client can make it hold."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest
from tests.contract.fuzz.edge import CAPPED_OUTPUT, MODEL, Edge, Reply, check_anthropic, check_openai, running_edge

LIMITS = {"max_messages": 8, "max_content_blocks": 4, "max_header_bytes": 4096, "max_body_bytes": 65536,
          "body_timeout_seconds": 1, "header_timeout_seconds": 1}
CHAT, MESSAGES, COUNT = "/v1/chat/completions", "/llm/v1/messages", "/llm/v1/messages/count_tokens"
USER = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("limits"), LIMITS) as running:
        yield running


Surface = tuple[str, dict[str, object], Callable[[Reply], None]]
SURFACES: list[Surface] = [(CHAT, {}, check_openai), (MESSAGES, {"max_tokens": 16}, check_anthropic)]
IDS = ["v1", "llm"]


def message(edge: Edge, reply: Reply) -> str:
    return str(reply.json()["error"]["message"])  # both shapes carry `error.message`


def post(edge: Edge, path: str, body: object, check: Callable[[Reply], None], **headers: str) -> Reply:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = edge.post(path, raw, headers)
    check(reply)
    return reply


@pytest.mark.parametrize(("path", "extra", "check"), SURFACES, ids=IDS)
def test_too_many_messages(edge: Edge, path: str, extra: dict[str, object], check: Callable[[Reply], None]) -> None:
    turns = [USER, {"role": "assistant", "content": "ok"}] * 4
    assert post(edge, path, {"model": MODEL, "messages": turns[:7], **extra}, check).status == 200
    reply = post(edge, path, {"model": MODEL, "messages": [*turns, USER], **extra}, check)
    assert reply.status == 400 and "at most 8" in message(edge, reply)


@pytest.mark.parametrize(("path", "extra", "check", "where"), [
    (CHAT, {}, check_openai, "messages[0].content"),
    (MESSAGES, {"max_tokens": 16}, check_anthropic, "messages.0.content"),
    (COUNT, {}, check_anthropic, "messages.0.content"),
], ids=["v1", "llm", "count_tokens"])
def test_too_many_content_blocks(
    edge: Edge, path: str, extra: dict[str, object], check: Callable[[Reply], None], where: str
) -> None:
    blocks = [{"type": "text", "text": "a"}] * 5
    reply = post(edge, path, {"model": MODEL, "messages": [{"role": "user", "content": blocks}], **extra}, check)
    assert reply.status == 400 and f"`{where}` has 5 content blocks" in message(edge, reply)
    ok = {"model": MODEL, "messages": [{"role": "user", "content": blocks[:4]}], **extra}
    assert post(edge, path, ok, check).status == 200


def test_too_many_system_blocks(edge: Edge) -> None:
    system = [{"type": "text", "text": "a"}] * 5
    reply = post(edge, MESSAGES, {"model": MODEL, "max_tokens": 8, "system": system, "messages": [USER]},
                 check_anthropic)
    assert reply.status == 400 and "`system`" in message(edge, reply)


@pytest.mark.parametrize(("path", "field", "check"), [
    (CHAT, "max_tokens", check_openai),
    (CHAT, "max_completion_tokens", check_openai),
    (MESSAGES, "max_tokens", check_anthropic),
], ids=["v1-max_tokens", "v1-max_completion_tokens", "llm-max_tokens"])
def test_max_output_tokens_per_upstream(edge: Edge, path: str, field: str, check: Callable[[Reply], None]) -> None:
    base = {"model": MODEL, "messages": [USER]}
    assert post(edge, path, {**base, field: CAPPED_OUTPUT}, check).status == 200
    for value in (CAPPED_OUTPUT + 1, 2**64):
        reply = post(edge, path, {**base, field: value}, check)
        assert reply.status == 400 and f"`{field}` is {value}" in message(edge, reply)
        if path == CHAT:
            assert reply.json()["error"]["param"] == field


@pytest.mark.parametrize(("path", "extra", "check"), SURFACES, ids=IDS)
@pytest.mark.parametrize("where", ["unknown", "tool"])
def test_deep_nesting_is_a_400(
    edge: Edge, path: str, extra: dict[str, object], check: Callable[[Reply], None], where: str
) -> None:
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    if where == "unknown":
        head = json.dumps({"model": MODEL, "messages": [USER], **extra})[:-1].encode()
        body = head + b', "x": ' + deep + b"}"
    else:
        tool = b'{"type":"function","function":{"name":"f","parameters":' + deep + b"}}" if path == CHAT \
            else b'{"name":"f","input_schema":' + deep + b"}"
        head = json.dumps({"model": MODEL, "messages": [USER], **extra})[:-1].encode()
        body = head + b', "tools": [' + tool + b"]}"
    reply = post(edge, path, body, check)
    assert reply.status == 400 and "nested too deeply" in message(edge, reply)


@pytest.mark.parametrize(("path", "extra", "check"), SURFACES, ids=IDS)
@pytest.mark.parametrize("number", [b"1e999999", b"-" + b"9" * 5000, b"18446744073709551616"])
def test_huge_numbers_are_a_400(
    edge: Edge, path: str, extra: dict[str, object], check: Callable[[Reply], None], number: bytes
) -> None:
    """Beyond float or 64-bit range: refused by the decoder; merely large: refused by the cap
    (`max_tokens`) or passed on as the upstream's to judge (a float `temperature` on `/v1`)."""
    head = json.dumps({"model": MODEL, "messages": [USER]})[:-1].encode()
    assert post(edge, path, head + b', "max_tokens": ' + number + b"}", check).status == 400
    reply = post(edge, path, head + b', "max_tokens": 8, "temperature": ' + number + b"}", check)
    assert reply.status == 400 or (path == CHAT and number == b"18446744073709551616")


@pytest.mark.parametrize(("path", "extra", "check"), SURFACES, ids=IDS)
def test_body_too_large(edge: Edge, path: str, extra: dict[str, object], check: Callable[[Reply], None]) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}], **extra})
    assert post(edge, path, body.encode(), check).status == 413


@pytest.mark.parametrize(("path", "extra", "check"), [*SURFACES, ("/v1/models", {}, check_openai)],
                         ids=[*IDS, "v1-models"])
def test_headers_too_large(edge: Edge, path: str, extra: dict[str, object], check: Callable[[Reply], None]) -> None:
    body = json.dumps({"model": MODEL, "messages": [USER], **extra}).encode()
    method = "GET" if path.endswith("models") else "POST"
    reply = edge.request(method, path, body if method == "POST" else None, {"x-big": "a" * 4200})
    check(reply)
    assert reply.status == 431 and "at most 4096" in message(edge, reply)
    assert edge.request(method, path, body if method == "POST" else None, {"x-ok": "a" * 3000}).status == 200


def raw_exchange(edge: Edge, chunks: list[bytes], pause: float = 0.0, wait: float = 5.0) -> bytes:
    """Send `chunks` on one connection; return all the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", edge.gateway.port), timeout=wait) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                time.sleep(pause)
        except OSError:
            pass  # the server stopped listening to us: read what it said
        received = b""
        try:
            while data := sock.recv(65536):
                received += data
        except OSError:
            pass
        return received


def test_endless_headers_are_cut_off_below_the_app(edge: Edge) -> None:
    head = [b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"] + [b"x-a: " + b"a" * 1000 + b"\r\n"] * 40
    started = time.monotonic()
    received = raw_exchange(edge, head, pause=0.005)
    assert received == b"" or received.startswith(b"HTTP/1.1 431 "), received[:200]
    assert time.monotonic() - started < 5
    assert edge.request("GET", "/v1/models").status == 200


@pytest.mark.parametrize(("path", "shape"), [(CHAT, b"application/problem+json"), (MESSAGES, b"application/json")],
                         ids=IDS)
def test_slow_body_is_a_408_in_the_surface_shape(edge: Edge, path: str, shape: bytes) -> None:
    started = time.monotonic()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    received = raw_exchange(edge, [head.encode() + b'{"model":'])
    assert received.startswith(b"HTTP/1.1 408 "), received[:300]
    headers, _, body = received.partition(b"\r\n\r\n")
    assert b"content-type: " + shape in headers and b"connection: close" in headers
    error = json.loads(body)
    assert "not received within 1 seconds" in (error["error"]["message"])
    assert 0.9 < time.monotonic() - started < 4


@pytest.mark.parametrize("chunks", [[], [b"POST /v1/chat/completions HTTP/1.1\r\n", b"host: x\r\n"]],
                         ids=["idle-connection", "slow-headers"])
def test_slow_or_missing_headers_are_cut_off(edge: Edge, chunks: list[bytes]) -> None:
    started = time.monotonic()
    received = raw_exchange(edge, chunks, pause=0.4)
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b"connection: close" in received
    assert 0.9 < time.monotonic() - started < 4


def test_invalid_utf8_is_a_400(edge: Edge) -> None:
    for path, extra, check in SURFACES:
        head = json.dumps({"model": MODEL, "max_tokens": 8, **extra})[:-1].encode()
        body = head + b', "messages": [{"role": "user", "content": "\xff\xfe"}]}'
        assert post(edge, path, body, check).status == 400
