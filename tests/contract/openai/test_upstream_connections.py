"""The gateway's upstream connection pool end to end: an upstream that restarts, one that
is down, and one that closes its connection after every answer (HTTP/1.0 style).

Clients: the official `openai` SDK with its own retries off, so every failure shows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
