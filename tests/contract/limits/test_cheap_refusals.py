"""Cheap refusals first, through real gateways: the key, then the consumer's request
count and its in-flight slot are decided before the body is read; only token limits wait
for the decoded body. `count_tokens` counts like any request, and so does every other path
that reaches a model (`/v1/responses`, `/v1/completions`, `/v1/embeddings`).

The tests of one kind share a gateway; each has a consumer of its own (its own quota and
slot), so no test spends what another one counts on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from tests.contract.limits.test_consumer_limits import LIMITED_KEY, OTHER_KEY, USER, _auth, _keys, _metrics
from tests.support.processes import Proc, Processes, free_port, upstream_toml

from adapters.outbound.keys_file import keys_entry, new_key

PATHS = {"/v1": "/v1/chat/completions", "/llm": "/llm/v1/messages", "responses": "/v1/responses",
         "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
COUNT = "/llm/v1/messages/count_tokens"
_CHAT = {"model": "plain", "messages": USER, "max_tokens": 8}
BODIES: dict[str, dict[str, object]] = {
    "/v1/chat/completions": _CHAT, "/llm/v1/messages": _CHAT, COUNT: _CHAT,
    "/v1/responses": {"model": "plain", "input": "hi", "max_output_tokens": 8},
    "/v1/completions": {"model": "plain", "prompt": "hi", "max_tokens": 8},
    "/v1/embeddings": {"model": "plain", "input": "hi"},
}


def _consumer(kind: str, surface: str) -> str:
    """The consumer of one test (`body-v1`, `waiter-llm`, ...)."""
    return f"{kind}-{surface.strip('/')}"


KEYS = {_consumer(kind, surface): new_key() for kind in ("body", "head", "waiter") for surface in PATHS}


def _shared_gateway(workdir: Path, stub_args: tuple[str, ...], kinds: Iterable[str], limits: str,
                    extra: str = "") -> Iterator[Proc]:
    """One gateway over one stub for the tests of `kinds`: each test's consumer with `limits`,
    and `other` without any."""
    keys = workdir / "keys.toml"
    keys.write_text("".join(keys_entry(_consumer(kind, surface), KEYS[_consumer(kind, surface)]) + limits + "\n"
                            for kind in kinds for surface in PATHS) + keys_entry("other", OTHER_KEY))
    procs = Processes(workdir)
    try:
        stub = procs.stub(*stub_args)
        yield procs.gateway(upstream_toml("plain", stub.url, ["plain"]) + _auth(keys) + extra)
    finally:
        procs.stop_all()


@pytest.fixture(scope="module")
def quota_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """Every test's consumer may send one request a minute."""
    yield from _shared_gateway(tmp_path_factory.mktemp("quota"), ("--tokens", "2"), ("body", "head"),
                               "requests_per_minute = 1")


@pytest.fixture(scope="module")
def waiting_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """Every test's consumer has one slot and one waiting place; the stub holds each answer 1.5 s."""
    yield from _shared_gateway(tmp_path_factory.mktemp("waiting"), ("--tokens", "2", "--hold", "1.5"), ("waiter",),
                               "max_in_flight = 1", extra="max_waiting_per_consumer = 1\n")


async def _post(c: httpx.AsyncClient, gw: Proc, path: str, key: str, content: bytes | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    body = content if content is not None else json.dumps(BODIES[path])
    return await c.post(gw.url + path, content=body, headers=headers)


def _check_429(answer: httpx.Response, path: str, limit_type: str = "requests") -> None:
    assert answer.status_code == 429, answer.text
    assert int(answer.headers["retry-after"]) >= 1
    if path.startswith("/v1"):
        assert answer.headers["content-type"].startswith("application/problem+json")
        error = answer.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and error["type"] == limit_type
    else:
        assert answer.json()["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("surface", sorted(PATHS))
async def test_a_rate_limited_keys_body_is_never_parsed(quota_gateway: Proc, surface: str) -> None:
    """3 MB of invalid JSON from a key over its requests_per_minute: 429, not 400."""
    gw, key = quota_gateway, KEYS[_consumer("body", surface)]
    path = PATHS[surface]
    async with httpx.AsyncClient(timeout=30) as c:
        assert (await _post(c, gw, path, key)).status_code == 200
        garbage = b'{"model": "plain", "input": [' + b"x" * 3_000_000
        _check_429(await _post(c, gw, path, key, garbage), path)
        # the same body from a key with quota is read and refused as what it is
        assert (await _post(c, gw, path, OTHER_KEY, garbage)).status_code == 400


def _head(path: str, key: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


@pytest.mark.parametrize("surface", sorted(PATHS))
async def test_a_key_without_quota_is_refused_before_its_body_is_sent(quota_gateway: Proc, surface: str) -> None:
    """The client sends only the head of a 4 MiB request: the 429 comes back without the body."""
    gw, key = quota_gateway, KEYS[_consumer("head", surface)]
    path = PATHS[surface]
    async with httpx.AsyncClient(timeout=30) as c:
        assert (await _post(c, gw, path, key)).status_code == 200
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(_head(path, key, 4 * 1024 * 1024))  # the head only: not a byte of the body
        sock.settimeout(5)  # well below body_timeout_seconds (30): a gateway reading the body would wait
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]
    assert b"retry-after: " in answer.lower()


@pytest.fixture
async def tokenizer() -> AsyncIterator[tuple[str, list[float]]]:
    """A recording upstream answering /tokenize after 0.5 s; the times of the calls it got."""
    calls: list[float] = []

    async def tokenize(request: web.Request) -> web.Response:
        calls.append(time.monotonic())
        await asyncio.sleep(0.5)
        return web.json_response({"count": 5, "max_model_len": 8192, "tokens": [1] * 5})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", calls
    finally:
        await runner.cleanup()


async def test_count_tokens_counts_toward_the_consumers_limits(
    procs: Processes, tmp_path: Path, tokenizer: tuple[str, list[float]]
) -> None:
    url, calls = tokenizer
    keys = _keys(tmp_path / "keys.toml", "requests_per_minute = 3\nmax_in_flight = 1")
    gw = procs.gateway(upstream_toml("plain", url, ["plain"]) + _auth(keys))
    async with httpx.AsyncClient(timeout=30) as c:
        assert (await _post(c, gw, COUNT, LIMITED_KEY)).status_code == 200
        # max_in_flight = 1: the second waits for the first's slot (0.5 s at the tokenizer)
        both = await asyncio.gather(_post(c, gw, COUNT, LIMITED_KEY), _post(c, gw, COUNT, LIMITED_KEY))
        assert [a.status_code for a in both] == [200, 200]
        assert calls[2] - calls[1] >= 0.45  # one after the other: the consumer's one slot
        refused = await _post(c, gw, COUNT, LIMITED_KEY)  # the fourth request of a minute of 3
        _check_429(refused, COUNT)
        assert refused.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert len(calls) == 3  # the refused one never reached the tokenizer
        counted = [v for name, labels, v in await _metrics(c, gw) if name == "gateway_rate_limited_total"
                   and labels == {"consumer": "limited", "limit": "requests_per_minute"}]
        assert counted == [1]


@pytest.mark.parametrize("surface", sorted(PATHS))
async def test_waiters_for_a_consumer_slot_are_bounded(waiting_gateway: Proc, surface: str) -> None:
    """max_in_flight = 1 and max_waiting_per_consumer = 1: one runs, one waits, the third is the
    consumer's own 429 at once; another consumer still gets in (the pool is not exhausted)."""
    gw, consumer = waiting_gateway, _consumer("waiter", surface)
    key = KEYS[consumer]
    path = PATHS[surface]
    async with httpx.AsyncClient(timeout=30) as c:
        running = asyncio.create_task(_post(c, gw, path, key))
        await asyncio.sleep(0.3)
        waiting = asyncio.create_task(_post(c, gw, path, key))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        refused = await _post(c, gw, path, key)
        assert time.monotonic() - started < 1.0  # at once, not after a wait
        _check_429(refused, path)
        assert "waiting" in refused.text
        other = await _post(c, gw, path, OTHER_KEY)  # another consumer: the upstream has room
        assert other.status_code == 200
        assert (await running).status_code == 200 and (await waiting).status_code == 200
        counted = [v for name, labels, v in await _metrics(c, gw) if name == "gateway_rate_limited_total"
                   and labels == {"consumer": consumer, "limit": "max_in_flight"}]
        assert counted == [1]
