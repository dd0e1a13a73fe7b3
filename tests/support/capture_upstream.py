"""A capturing upstream in the test process: it records each body it receives and answers one
short vLLM-shaped answer (chat and text completions: `ok`, streamed or not; embeddings: one
2-d vector per input), or a canned refusal per path, so a test can show what reaches an upstream."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

_HEAD = {"id": "chatcmpl-cap", "object": "chat.completion.chunk", "created": 1, "model": "capture"}
FRAMES = [
    {**_HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]},
    {**_HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {**_HEAD, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}},
]
SSE = b"".join(b"data: " + msgspec.json.encode(f) + b"\n\n" for f in FRAMES) + b"data: [DONE]\n\n"
COMPLETION = {"id": "chatcmpl-cap", "object": "chat.completion", "created": 1, "model": "capture",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}


_TEXT_HEAD = {"id": "cmpl-cap", "object": "text_completion", "created": 1, "model": "capture"}
TEXT_FRAMES = [
    {**_TEXT_HEAD, "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": None}], "usage": None},
    {**_TEXT_HEAD, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop",
                                "stop_reason": None}], "usage": None},
    {**_TEXT_HEAD, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}},
]
TEXT_SSE = b"".join(b"data: " + msgspec.json.encode(f) + b"\n\n" for f in TEXT_FRAMES) + b"data: [DONE]\n\n"
TEXT = {**_TEXT_HEAD, "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": "stop",
                                   "stop_reason": None, "prompt_logprobs": None}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}


def _embeddings(body: dict[str, Any]) -> dict[str, Any]:
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    data = [{"index": i, "object": "embedding", "embedding": [0.6, 0.8]} for i in range(len(inputs))]
    return {"id": "embd-cap", "object": "list", "created": 1, "model": "capture", "data": data,
            "usage": {"prompt_tokens": 2 * len(inputs), "total_tokens": 2 * len(inputs)}}


class CaptureHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CaptureServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append(body)
        self.server.requests.append((self.path, body))
        refusal = self.server.refusals.get(self.path)
        status, kind = 200, "application/json"
        if refusal is not None:
            status, payload = refusal[0], msgspec.json.encode(refusal[1])
        elif self.path == "/v1/embeddings":
            payload = msgspec.json.encode(_embeddings(body))
        elif self.path == "/v1/completions":
            payload, kind = (TEXT_SSE, "text/event-stream") if body.get("stream") else (
                msgspec.json.encode(TEXT), "application/json")  # fmt: skip
        else:
            payload, kind = (SSE, "text/event-stream") if body.get("stream") else (
                msgspec.json.encode(COMPLETION), "application/json")  # fmt: skip
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


class CaptureServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), CaptureHandler)
        self.bodies: list[dict[str, Any]] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (path, body)
        self.refusals: dict[str, tuple[int, dict[str, Any]]] = {}  # path -> (status, JSON body) to answer
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
