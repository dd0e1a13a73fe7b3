"""The client's connection, through a real gateway and stub: a client that stops reading its
answer is dropped after `client_write_timeout_seconds` (its slot freed, the upstream call
aborted), and an idle keep-alive connection is closed after `keep_alive_timeout_seconds`.

The stalled reader is a raw socket with a tiny receive buffer (set before connect, so the
TCP window stays small) that sends one request and never reads. Every streaming path is
covered: chat on both surfaces, the Responses API and text completions. The ops listener
runs the same protocol with the same keep-alive.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml

WRITE_TIMEOUT = 1.5
MARGIN = 6.0  # scheduling on a busy machine; without the bound the slot is never freed at all
ADMISSION = {"sequence_slots": 2, "max_in_flight": 1, "queue_depth": 4, "queue_timeout_seconds": 60}
PATHS = {"/v1": "/v1/chat/completions", "/llm": "/llm/v1/messages"}
STREAMS = {**PATHS, "responses": "/v1/responses", "completions": "/v1/completions"}


def _body(path: str, stream: bool, max_tokens: int) -> dict[str, object]:
    if path == "/v1/responses":
        return {"model": "plain", "max_output_tokens": max_tokens, "stream": stream, "input": "hi"}
    if path == "/v1/completions":
        return {"model": "plain", "max_tokens": max_tokens, "stream": stream, "prompt": "hi"}
    return {"model": "plain", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}


def _gateway(procs: Processes, stub: Proc, extra: str = "") -> Proc:
    return procs.gateway(upstream_toml("plain", stub.url, ["plain"], ADMISSION),
                         server_extra=f"client_write_timeout_seconds = {WRITE_TIMEOUT}\n{extra}")


def _request(path: str, stream: bool, max_tokens: int) -> bytes:
    body = json.dumps(_body(path, stream, max_tokens)).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _stalled_reader(port: int, request: bytes) -> socket.socket:
    """A client that sends `request` and never reads a byte of the answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays tiny
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    return sock


def _slots(client: httpx.Client, gw: Proc) -> float:
    text = client.get(gw.ops_url + "/metrics").text
    return sum(v for name, labels, v in samples(text)
               if name == "gateway_upstream_slots_in_use" and labels.get("upstream") == "plain")


def _wait_for(check: object, timeout: float) -> float:
    """Seconds until `check()` is true; fails after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.05)
    pytest.fail(f"not within {timeout}s")


@pytest.mark.parametrize("surface", sorted(STREAMS))
def test_a_stream_reader_that_stops_reading_loses_its_slot(procs: Processes, tmp_path: Path, surface: str) -> None:
    log = tmp_path / "stub.log"
    # 200,000 tokens at 0.5 ms each (a context that long): far more than the socket buffers hold, longer than the test
    stub = procs.stub("--tokens", "200000", "--max-model-len", "300000", "--chunk-delay", "0.0005", log=log)
    gw = _gateway(procs, stub)
    path = STREAMS[surface]
    with httpx.Client(timeout=30) as client:
        stalled = _stalled_reader(gw.port, _request(path, True, 200_000))
        try:
            _wait_for(lambda: _slots(client, gw) == 1, 10)
            freed = _wait_for(lambda: _slots(client, gw) == 0, WRITE_TIMEOUT + MARGIN)
            assert freed >= WRITE_TIMEOUT - 0.5  # dropped for stalling, not for something else earlier
            # the one slot is free again: another request is admitted and answered
            answer = client.post(gw.url + path, json=_body(path, False, 4))
            assert answer.status_code == 200
        finally:
            stalled.close()
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and "in_flight=1 " in lines[1]  # the stalled call was aborted upstream
    access = [json.loads(line) for line in gw.text().splitlines() if line.startswith("{")]
    dropped = next(r for r in access if r["stream"])
    assert dropped["client_gone"] is True and dropped["error_kind"] == "client_stalled"
    assert dropped["status"] == 200  # the stream had started: the status went out before the stall


@pytest.mark.parametrize("surface", sorted(PATHS))
def test_a_hang_up_mid_stream_frees_the_slot_at_once_even_when_the_upstream_is_fast(
    procs: Processes, surface: str
) -> None:
    """Litestar's cancellation of a stream whose upstream data is always ready lands late
    (anyio cancels only a task waiting on something not ready): the edge stops the stream at
    its next frame instead."""
    stub = procs.stub("--tokens", "200000", "--max-model-len", "300000", "--chunk-delay", "0.0001")
    gw = procs.gateway(upstream_toml("plain", stub.url, ["plain"], ADMISSION))  # the default write timeout
    with httpx.Client(timeout=30) as client:
        sock = _stalled_reader(gw.port, _request(PATHS[surface], True, 200_000))
        _wait_for(lambda: _slots(client, gw) == 1, 10)
        time.sleep(2.0)  # the buffers are full: the gateway waits to write, the upstream's answer piles up
        sock.close()  # unread data: the gateway sees a reset, then finds the upstream's backlog ready
        assert _wait_for(lambda: _slots(client, gw) == 0, 10) < 2.0


def test_a_stream_read_to_its_end_is_no_hang_up(procs: Processes) -> None:
    """After the last byte the server reports a disconnect to whoever listens: that is not the
    client leaving."""
    stub = procs.stub("--tokens", "5")
    gw = _gateway(procs, stub)
    with httpx.Client(timeout=30) as client:
        for path in PATHS.values():
            answer = client.post(gw.url + path, json={"model": "plain", "max_tokens": 5, "stream": True,
                                                      "messages": [{"role": "user", "content": "hi"}]})
            assert answer.status_code == 200 and answer.text.rstrip().endswith(("[DONE]", '"message_stop"}'))
    time.sleep(0.3)
    access = [json.loads(line) for line in gw.text().splitlines() if line.startswith("{")]
    assert [(r["client_gone"], r["error_kind"]) for r in access] == [(False, None), (False, None)]


def test_a_plain_answer_nobody_reads_is_dropped_with_its_connection(procs: Processes) -> None:
    """A non-streamed answer's slot is free once the answer is made; what stays is the answer in
    the connection's buffers: the connection is aborted after the write timeout."""
    # a 12 MB answer (a context that long): more than the kernel's socket buffers hold
    stub = procs.stub("--tokens", "2000000", "--max-model-len", "3000000")
    gw = _gateway(procs, stub)
    stalled = _stalled_reader(gw.port, _request(PATHS["/v1"], False, 2_000_000))
    try:
        _wait_for(lambda: "the client stopped reading its answer" in gw.text(), WRITE_TIMEOUT + MARGIN)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        stalled.settimeout(10)
        received = b""
        try:  # aborted: the connection ends (reset or EOF) before the rest of the answer
            while chunk := stalled.recv(1 << 16):
                received += chunk
        except ConnectionResetError:
            pass
    finally:
        stalled.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert len(body) < _content_length(head)
    assert "the client stopped reading its answer" in gw.text()


def _answer(sock: socket.socket) -> bytes:
    """One whole response (head and a Content-Length body) read from `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(1 << 16)
    head, _, body = data.partition(b"\r\n\r\n")
    while len(body) < _content_length(head):
        body += sock.recv(1 << 16)
    return head


def _content_length(head: bytes) -> int:
    return next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))


@pytest.mark.parametrize("listener", ["public", "ops"])
def test_idle_keep_alive_connections_are_closed_after_keep_alive_timeout(procs: Processes, listener: str) -> None:
    stub = procs.stub("--tokens", "2")
    gw = _gateway(procs, stub, "keep_alive_timeout_seconds = 2")
    port, path = (gw.port, "/v1/models") if listener == "public" else (int(gw.ops_url.rsplit(":", 1)[1]), "/healthz")
    request = f"GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        sock.sendall(request)
        assert _answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)
        sock.sendall(request)  # still open after 1 s idle: the connection is reused
        assert _answer(sock).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        assert sock.recv(1 << 16) == b""  # then closed by the gateway
        idle = time.monotonic() - idle_from
    assert 1.5 <= idle <= 5.0
