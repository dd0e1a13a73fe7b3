"""A real gateway (and stub upstream) for one test module, a raw HTTP client for it, and
the checks every fuzzed answer must pass: a success, or a 4xx in the surface's shape.

Each request uses a fresh loopback connection through `http.client`, so that a dropped
connection, a reset or a truncated body is an exception here, never a silent retry.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, upstream_toml

MODEL = "m"
CAPPED_OUTPUT = 256  # max_output_tokens of the fuzzed upstream
SERVER_KEYS = {  # `[server]` keys of the fuzzed gateway: small limits, so that fuzzing reaches them
    "max_body_bytes": 1024 * 1024,
    "max_messages": 64,
    "max_content_blocks": 16,
    "max_header_bytes": 8192,
    "body_timeout_seconds": 5,
    "access_log": "false",
}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()

    def json(self) -> Any:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.content_type}: {self.body[:600]!r}"


@dataclass
class Edge:
    gateway: Proc
    stub: Proc

    @property
    def url(self) -> str:
        return self.gateway.url

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.gateway.port, timeout=timeout)
        try:
            sent = {"content-type": "application/json", **(headers or {})}
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            data = response.read()  # raises IncompleteRead on a truncated body
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        finally:
            conn.close()

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Reply:
        return self.request("POST", path, body, headers)


def gateway_toml(stub_url: str, server: dict[str, Any] | None = None) -> str:
    """Extra `[server]` keys (the harness writes `[server] listen`) and the capped upstream."""
    keys = {**SERVER_KEYS, **(server or {})}
    lines = "".join(f"{key} = {value}\n" for key, value in keys.items())
    return lines + upstream_toml("main", stub_url, [MODEL], extra=f"max_output_tokens = {CAPPED_OUTPUT}\n")


@contextmanager
def running_edge(workdir: Path, server: dict[str, Any] | None = None) -> Iterator[Edge]:
    procs = Processes(workdir)
    try:
        stub = procs.stub("--tokens", "6")
        gateway = procs.gateway(gateway_toml(stub.url, server))
        yield Edge(gateway, stub)
    finally:
        procs.stop_all(wait=True)  # what they printed while stopping is read next
        for proc in procs.procs:
            text = proc.text()
            if "Traceback" in text or "unhandled error" in text:
                print(f"--- {proc.output.name} ---\n{text[-6000:]}")


# --- the shapes ---------------------------------------------------------------------


def check_openai(reply: Reply, stream_ok: bool = True) -> None:
    """`/v1`: 2xx (JSON, or SSE ending in `[DONE]`), or a 4xx problem document with `error`."""
    assert reply.status < 500, str(reply)
    if reply.status >= 400:
        assert reply.content_type == "application/problem+json", str(reply)
        problem = reply.json()
        assert problem["status"] == reply.status, str(reply)
        assert isinstance(problem["title"], str) and isinstance(problem["detail"], str), str(reply)
        assert problem["type"].startswith("https://"), str(reply)
        error = problem["error"]
        assert isinstance(error["message"], str) and error["message"], str(reply)
        assert error["type"] == "invalid_request_error", str(reply)
        assert isinstance(error["code"], str), str(reply)
        return
    assert reply.status == 200, str(reply)
    if reply.content_type == "text/event-stream":
        assert stream_ok, str(reply)
        assert reply.body.endswith(b"data: [DONE]\n\n"), str(reply)
        return
    assert reply.content_type == "application/json", str(reply)
    body = reply.json()
    assert body["object"] in ("chat.completion", "list"), str(reply)


# The one upstream fault fuzzing provokes: offered a tool whose schema is not an object
# schema, the stub calls it with arguments that are JSON but not an object (as vLLM 0.32 may
# answer a named tool_choice), which an Anthropic `tool_use.input` cannot carry. The gateway
# answers a documented 502 (`upstream-protocol-error`), or ends a stream with it.
UPSTREAM_TOOL_ARGS = "The upstream produced tool call arguments that are not a JSON object."


def check_anthropic(reply: Reply) -> None:
    """`/llm`: 2xx (a message, a token count, a model list, or a stream ending in `message_stop`
    or `error`), or a 4xx `{"type": "error", "error": {"type", "message"}}`."""
    if reply.status == 502 and reply.json()["error"]["message"] == UPSTREAM_TOOL_ARGS:
        return  # see UPSTREAM_TOOL_ARGS
    assert reply.status < 500, str(reply)
    if reply.status >= 400:
        assert reply.content_type == "application/json", str(reply)
        body = reply.json()
        assert body["type"] == "error", str(reply)
        assert isinstance(body["error"]["type"], str) and body["error"]["type"], str(reply)
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], str(reply)
        assert reply.headers.get("request-id"), str(reply)
        return
    assert reply.status == 200, str(reply)
    if reply.content_type == "text/event-stream":
        events = check_anthropic_stream(reply.body)  # never a tool_use whose input is no object
        if events[-1].name == "error":  # see UPSTREAM_TOOL_ARGS
            assert events[-1].data["error"] == {"type": "api_error", "message": UPSTREAM_TOOL_ARGS}, str(reply)
        return
    assert reply.content_type == "application/json", str(reply)
    body = reply.json()
    assert body.get("type") == "message" or isinstance(body.get("input_tokens"), int) or "data" in body, str(reply)
