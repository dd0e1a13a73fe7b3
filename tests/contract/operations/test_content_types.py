"""Every response of a real `gateway serve` process names its content type once, its charset once.

Litestar appends `; charset=utf-8` to a `text/...` media type even when it names one already,
which served `text/plain; charset=utf-8; charset=utf-8` on `/healthz`, `/readyz`, `/metrics` and
`/status`. Read off the wire (the raw header lines), on the main and the ops listener, for every
kind of answer: health text, the Prometheus exposition, the HTML status page, JSON, problem
documents, Anthropic errors, the OpenAPI document and the three dialects' event streams.
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import prometheus_client
from tests.support.processes import Proc, Processes, upstream_toml

TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
JSON = "application/json"
PROBLEM = "application/problem+json"
SSE = "text/event-stream; charset=utf-8"
CHAT = {"model": "plain", "messages": [{"role": "user", "content": "hi"}]}


def content_type(reply: httpx.Response) -> str:
    """The one content-type header line as sent; fails on none, two, or a charset named twice."""
    lines = [value.decode("latin-1") for name, value in reply.headers.raw if name.lower() == b"content-type"]
    assert len(lines) == 1, lines
    assert lines[0].count("charset=") <= 1, lines[0]
    return lines[0]


def test_each_endpoint_names_its_content_type_once_on_both_listeners(procs: Processes) -> None:
    gw = procs.gateway(upstream_toml("plain", procs.stub().url, ["plain"]))
    main, ops = gw.url, gw.ops_url
    expected_get = {
        (main, "/healthz"): TEXT,
        (main, "/readyz"): TEXT,
        (ops, "/healthz"): TEXT,
        (ops, "/readyz"): TEXT,
        (ops, "/metrics"): prometheus_client.CONTENT_TYPE_LATEST,
        (ops, "/status"): HTML,
        (ops, "/status.json"): JSON,
        (ops, "/no-such-path"): JSON,
        (main, "/no-such-path"): JSON,
        (main, "/schema/openapi.json"): "application/vnd.oai.openapi+json",
        (main, "/v1/models"): JSON,
        (main, "/llm/v1/models"): JSON,
        (main, "/v1/no-such-path"): PROBLEM,
        (main, "/llm/no-such-path"): JSON,
    }
    for (base, path), expected in expected_get.items():
        reply = httpx.get(base + path)
        where = f"{'ops' if base == ops else 'main'} {path}: {reply.status_code}"
        assert content_type(reply) == expected, where
    assert prometheus_client.CONTENT_TYPE_LATEST.count("charset=") == 1  # the case that doubled it

    expected_post = [
        ("/v1/chat/completions", CHAT, 200, JSON),
        ("/v1/chat/completions", {**CHAT, "stream": True}, 200, SSE),
        ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, PROBLEM),
        ("/v1/completions", {"model": "plain", "prompt": "hi", "stream": True}, 200, SSE),
        ("/v1/responses", {"model": "plain", "input": "hi", "stream": True}, 200, SSE),
        ("/v1/responses", {"model": "nope", "input": "hi"}, 404, PROBLEM),
        ("/llm/v1/messages", {**CHAT, "max_tokens": 8, "stream": True}, 200, SSE),
        ("/llm/v1/messages", {**CHAT, "max_tokens": 8}, 200, JSON),
        ("/llm/v1/messages", {"model": "plain"}, 400, JSON),
    ]
    for path, body, status, expected in expected_post:
        reply = httpx.post(main + path, json=body)
        assert reply.status_code == status, (path, reply.text)
        assert content_type(reply) == expected, (path, status)


def test_a_draining_readyz_names_its_charset_once_on_both_listeners(procs: Processes) -> None:
    stub = procs.stub("--hold", "2")
    gw: Proc = procs.gateway(upstream_toml("plain", stub.url, ["plain"]), server_extra="drain_grace_seconds = 20")
    held = threading.Thread(target=lambda: httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=20))
    held.start()  # an admitted request keeps the process draining, its listeners up
    deadline = time.monotonic() + 5
    while httpx.get(gw.ops_url + "/status.json").json()["upstreams"][0]["in_flight"] != 1:
        assert time.monotonic() < deadline, "the held request was not admitted"
        time.sleep(0.02)
    gw.signal(signal.SIGTERM)
    for base in (gw.url, gw.ops_url):
        deadline = time.monotonic() + 5
        while (reply := httpx.get(base + "/readyz")).status_code != 503:
            assert time.monotonic() < deadline, f"{base}/readyz never said draining"
            time.sleep(0.02)
        assert reply.text == "draining\n" and content_type(reply) == TEXT, base
    held.join()
