"""The gateway's upstream connection pool end to end: an upstream that restarts, one that
is down, one that closes its connection after every answer (HTTP/1.0 style), and one
behind TLS.

Clients: the official `openai` SDK with its own retries off, so every failure shows."""

from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import openai
import pytest
from tests.support.processes import Processes, upstream_toml

USER = [{"role": "user", "content": "hi"}]
COMPLETION = msgspec.json.encode({
    "id": "chatcmpl-10", "object": "chat.completion", "created": 1, "model": "old",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
})  # fmt: skip


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=10)


def ask(sdk: openai.OpenAI, model: str = "m", stream: bool = False) -> str:
    if stream:
        chunks = sdk.chat.completions.create(model=model, messages=USER, stream=True)  # type: ignore[arg-type]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = sdk.chat.completions.create(model=model, messages=USER)  # type: ignore[arg-type]
    return answer.choices[0].message.content or ""


def test_an_upstream_restart_costs_no_request_once_it_is_back(procs: Processes) -> None:
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("up", stub.url, ["m"]))
    sdk = client(gateway.url)
    for stream in (False, True, False, True):  # pooled keep-alive connections to the first stub
        assert ask(sdk, stream=stream)
    stub.stop()  # its pooled connections die with it
    with pytest.raises(openai.APIStatusError) as down:
        ask(sdk)
    assert down.value.status_code == 502 and "unreachable" in down.value.message
    procs.stub(port=stub.port)  # back, on the same address
    for stream in (False, True, False, True):
        assert ask(sdk, stream=stream)


class Http10Handler(BaseHTTPRequestHandler):
    """Answers and closes the connection every time (no keep-alive, no Content-Length)."""

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if self.protocol_version == "HTTP/1.1":  # keep-alive: the body needs its length
            self.send_header("content-length", str(len(COMPLETION)))
        self.end_headers()
        self.wfile.write(COMPLETION)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def http10_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Http10Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_upstream_that_closes_after_every_answer(procs: Processes, http10_url: str) -> None:
    gateway = procs.gateway(upstream_toml("old", http10_url, ["old"]))
    sdk = client(gateway.url)
    for _ in range(5):  # each answer's body ends with its connection; none is reused
        assert ask(sdk, "old") == "ok"


# --- an https:// upstream ------------------------------------------------------------


class JsonHandler(Http10Handler):
    """The same answer on keep-alive HTTP/1.1 connections."""

    protocol_version = "HTTP/1.1"


@pytest.fixture
def tls_upstream(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS upstream on 127.0.0.1 with a self-signed certificate for localhost; yields its
    URL and the certificate (to trust it, as a CA file)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), JsonHandler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://localhost:{server.server_address[1]}", cert
    server.shutdown()
    server.server_close()


def test_an_https_upstream_is_verified_against_the_trusted_cas(
    procs: Processes, tls_upstream: tuple[str, Path]
) -> None:
    url, cert = tls_upstream
    trusting, untrusting = procs.together([  # the second with the system CAs only
        partial(procs.gateway, upstream_toml("old", url, ["old"]), env={"SSL_CERT_FILE": str(cert)}),
        partial(procs.gateway, upstream_toml("old", url, ["old"]))])
    for _ in range(3):  # TLS on pooled keep-alive connections
        assert ask(client(trusting.url), "old") == "ok"
    with pytest.raises(openai.APIStatusError) as refused:
        ask(client(untrusting.url), "old")
    assert refused.value.status_code == 502 and "unreachable" in refused.value.message
