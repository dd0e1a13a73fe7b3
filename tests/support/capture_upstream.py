"""A capturing upstream in the test process: it records each body it receives and answers
one short vLLM-shaped text (`ok`), streamed or not, so a test can show what reaches an upstream."""

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


class CaptureHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CaptureServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.bodies.append(body)
        payload, kind = (SSE, "text/event-stream") if body.get("stream") else (
            msgspec.json.encode(COMPLETION), "application/json")  # fmt: skip
        self.send_response(200)
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
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


