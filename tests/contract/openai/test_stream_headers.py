"""A stream's response head, as a raw HTTP client sees it, on `/v1` and `/llm`: one content
type (`text/event-stream; charset=utf-8`, given by the edge before Litestar would add it), no
buffering by a proxy (`cache-control: no-cache`, `x-accel-buffering: no`), the request id."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from tests.support.processes import Processes, upstream_toml

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "m", "stream": True, "messages": USER}),
        ("/llm/v1/messages", {"model": "m", "max_tokens": 16, "stream": True, "messages": USER}),
    ],
)
def test_a_stream_head_names_its_type_once_and_asks_proxies_not_to_buffer(
    procs: Processes, path: str, body: dict[str, object]
) -> None:
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("up", stub.url, ["m"]))
    url = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        resp = conn.getresponse()
        headers = [(name.lower(), value) for name, value in resp.getheaders()]
        data = resp.read()
    finally:
        conn.close()
    assert resp.status == 200
    assert [value for name, value in headers if name == "content-type"] == ["text/event-stream; charset=utf-8"]
    assert ("cache-control", "no-cache") in headers and ("x-accel-buffering", "no") in headers
    assert [name for name, _ in headers].count("x-request-id") == 1
    assert data.rstrip().endswith(b"[DONE]" if path.startswith("/v1") else b'{"type":"message_stop"}')
