"""`[server] problem_base_url` through a real `gateway serve` process: the `type` of every `/v1`
problem document is the configured base (its missing '/' added) plus the failure's kind, on each
path that answers problems (chat and text completions, embeddings, the Responses API, the model
list, unknown paths and methods), refusals of a full queue (503) included. `/llm` answers the
Anthropic error shape, which has no type URI; the ops listener answers no problem documents.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from tests.support.processes import Processes, upstream_toml

BASE = "https://errors.example.test/gateway/problems/"
CAP = {"sequence_slots": 2, "max_in_flight": 1, "queue_depth": 0, "queue_timeout_seconds": 30}


def problem(reply: httpx.Response, status: int) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = reply.json()
    assert doc["status"] == status, doc
    return doc


def test_v1_problem_types_use_the_configured_base(procs: Processes) -> None:
    held = procs.stub("--hold", "2")
    gw = procs.gateway(upstream_toml("plain", procs.stub().url, ["plain"])
                       + upstream_toml("held", held.url, ["held"], CAP),
                       server_extra=f'problem_base_url = "{BASE.rstrip("/")}"')
    v1 = f"{gw.url}/v1"
    chat = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    refused = {
        "/chat/completions": chat,
        "/completions": {"model": "nope", "prompt": "hi"},
        "/embeddings": {"model": "nope", "input": "hi"},
        "/responses": {"model": "nope", "input": "hi"},
    }
    for path, body in refused.items():
        assert problem(httpx.post(v1 + path, json=body), 404)["type"] == BASE + "model-not-found", path
        assert problem(httpx.post(v1 + path, content=b"{"), 400)["type"] == BASE + "invalid-request", path
    assert problem(httpx.get(v1 + "/no-such-path"), 404)["type"] == BASE + "not-found"
    assert problem(httpx.delete(v1 + "/models"), 405)["type"] == BASE + "method-not-allowed"

    # A full queue: one request holds the only slot, queue_depth = 0 refuses the next.
    holder = threading.Thread(target=lambda: httpx.post(v1 + "/chat/completions", timeout=20,
                                                        json={**chat, "model": "held"}))
    holder.start()
    deadline = time.monotonic() + 5
    while httpx.get(gw.ops_url + "/status.json").json()["upstreams"][1]["in_flight"] != 1:
        assert time.monotonic() < deadline, "the holding request was not admitted"
        time.sleep(0.02)
    for path, body in (("/chat/completions", {**chat, "model": "held"}),
                       ("/responses", {"model": "held", "input": "hi"})):
        assert problem(httpx.post(v1 + path, json=body), 503)["type"] == BASE + "queue-full", path
    holder.join()

    # The Anthropic shape names no type URI; the ops listener renders no problems.
    anthropic = httpx.post(f"{gw.url}/llm/v1/messages", json={**chat, "max_tokens": 8})
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    assert "https://" not in anthropic.text
    ops = httpx.get(gw.ops_url + "/no-such-path")
    assert ops.status_code == 404 and "problems/" not in ops.text
