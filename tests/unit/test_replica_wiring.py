"""The composition root's replica wiring: one discovery per upstream with `[endpoints]`, started
with the app and told to the gate; every admitted request's upstream call names its replica; the
record, metrics, /readyz and /status.json show the replicas; the affinity store follows the
backend. A fake upstream client stands in for the model servers (it notes which replica each call
went to)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from dependency_injector import providers
from litestar.testing import AsyncTestClient

import bootstrap
from adapters.inbound.operations import ops_app
from adapters.outbound.memory_affinity import MemoryAffinityStore
from adapters.outbound.replica_discovery import ReplicaWatch, StaticReplicas
from config import load_config_text
from domain.canonical import (
    ChatRequest,
    ChatResponse,
    ChunkBatch,
    Finish,
    MessageStart,
    StreamChunk,
    TextDelta,
    TextPart,
    Usage,
    UsageReport,
)
from domain.errors import UpstreamUnavailable
from domain.resume import TokenTrail
from domain.upstream_failures import FailureKind
from ports.discovery import ReadyListener
from wiring import replicas

A, B = "http://10.0.0.1:8080", "http://10.0.0.2:8080"
CONFIG = f"""
[upstreams.up]
url = "http://127.0.0.1:9"
models = ["m"]
[upstreams.up.admission]
sequence_slots = 8
max_in_flight = 6
queue_depth = 2
queue_timeout_seconds = 5
[upstreams.up.endpoints]
urls = ["{A}", "{B}"]
sequence_slots = 4
max_in_flight = 4
load_metrics = false  # the replicas are fake addresses: nothing is read from them

[upstreams.plain]
url = "http://127.0.0.1:10"
models = ["p"]
"""


def with_endpoints(extra: str) -> str:
    """CONFIG with more keys in `[upstreams.up.endpoints]`."""
    return CONFIG.replace("load_metrics = false", f"load_metrics = false\n{extra}")


class ReplicaNotingClient:
    """`ports.upstream.UpstreamClient` answering at once, noting the replica of every call."""

    def __init__(self) -> None:
        self.replicas: list[str | None] = []

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        self.replicas.append(replica)
        return ChatResponse(id="c", model=request.model, created=0, content=[TextPart(text="hi")],
                            finish_reason="end_turn", usage=Usage(input_tokens=1, output_tokens=1))

    @asynccontextmanager
    async def open_stream(self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None,
                          trail: TokenTrail | None = None) -> AsyncIterator[AsyncIterator[ChunkBatch]]:
        """A whole answer (a plain request that may be resumed is asked as a stream)."""
        self.replicas.append(replica)

        async def batches() -> AsyncIterator[ChunkBatch]:
            yield [StreamChunk(events=[MessageStart(id="c", model=request.model, created=0), TextDelta(text="hi"),
                                       Finish(reason="end_turn"), UsageReport(usage=Usage(input_tokens=1,
                                                                                          output_tokens=1))])]

        yield batches()

    async def count_tokens(self, request: ChatRequest) -> int:
        return 1


async def test_requests_are_sent_to_the_replicas_the_gate_binds_and_every_view_shows_them() -> None:
    container = bootstrap.Container(config=load_config_text(CONFIG))
    replicated, plain = ReplicaNotingClient(), ReplicaNotingClient()
    container.upstreams.override(providers.Object({"up": replicated, "plain": plain}))
    seen: list[object] = []
    container.request_log.override(providers.Object(_Records(seen)))
    app = container.app()
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with AsyncTestClient(app) as client:
        for stream in (False, True, False, True):
            assert (await client.post("/v1/chat/completions", json={**chat, "stream": stream})).status_code == 200
        assert (await client.post("/v1/chat/completions", json={**chat, "model": "p"})).status_code == 200
        assert (await client.get("/readyz")).text == "ready\n"
        async with AsyncTestClient(container.ops_app()) as ops:
            page = (await ops.get("/metrics")).text
            status = (await ops.get("/status.json")).json()
    # Equal loads rotate: the four calls alternate between the two replicas; `plain` calls its url.
    assert replicated.replicas == [A, B, A, B] and plain.replicas == [None]
    assert [getattr(r, "endpoint", None) for r in seen] == ["10.0.0.1:8080", "10.0.0.2:8080"] * 2 + [None]
    assert 'gateway_upstream_endpoints{state="ready",upstream="up"} 2.0' in page
    assert 'gateway_upstream_endpoints{state="draining",upstream="up"} 0.0' in page
    assert 'gateway_upstream_endpoints{state="ejected",upstream="up"} 0.0' in page
    assert 'gateway_endpoint_ejections_total{endpoint="10.0.0.1:8080",upstream="up"} 0.0' in page
    assert 'gateway_endpoint_requests_total{endpoint="10.0.0.1:8080",upstream="up"} 2.0' in page
    assert 'gateway_endpoint_in_flight{endpoint="10.0.0.2:8080",upstream="up"} 0.0' in page
    assert 'upstream="plain"' not in "".join(line for line in page.splitlines() if "endpoint" in line)
    by_name = {u["name"]: u["replicas"] for u in status["upstreams"]}
    assert by_name["plain"] == []
    assert by_name["up"] == [{"address": A, "state": "ready", "in_flight": 0, "limit": 4},
                             {"address": B, "state": "ready", "in_flight": 0, "limit": 4}]


class RefusingA(ReplicaNotingClient):
    """Every call on replica A is refused (nothing reached it); B answers."""

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        if replica == A:
            self.replicas.append(replica)
            raise UpstreamUnavailable("unreachable", failure=FailureKind.CONNECT)
        return await super().complete(request, replica)

    def open_stream(self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None,
                    trail: TokenTrail | None = None) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """Plain requests too: one that may be resumed is asked as a stream."""
        if replica == A:
            self.replicas.append(replica)
            raise UpstreamUnavailable("unreachable", failure=FailureKind.CONNECT)
        return super().open_stream(request, replica, heartbeat, trail)


async def test_a_refused_call_is_retried_on_the_other_replica_and_enough_of_them_eject_it() -> None:
    text = with_endpoints("consecutive_failures = 2")
    container = bootstrap.Container(config=load_config_text(text))
    client = RefusingA()
    container.upstreams.override(providers.Object({"up": client, "plain": ReplicaNotingClient()}))
    seen: list[object] = []
    container.request_log.override(providers.Object(_Records(seen)))
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with AsyncTestClient(container.app()) as http:
        for _ in range(6):
            assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
        async with AsyncTestClient(container.ops_app()) as ops:
            page = (await ops.get("/metrics")).text
    # A refuses, B answers (the move made B the last pick, so A is next); A refuses again and is
    # ejected (its 2nd failure in a row), B answers; B gets the rest.
    assert client.replicas == [A, B, A, B, B, B, B, B]
    assert [getattr(r, "retried_from", None) for r in seen] == ["10.0.0.1:8080"] * 2 + [None] * 4
    assert {getattr(r, "endpoint", None) for r in seen} == {"10.0.0.2:8080"}
    assert 'gateway_upstream_endpoints{state="ejected",upstream="up"} 1.0' in page
    assert 'gateway_endpoint_ejections_total{endpoint="10.0.0.1:8080",upstream="up"} 1.0' in page


class _Records:
    def __init__(self, seen: list[object]) -> None:
        self.seen = seen

    def request_started(self, record: object, headers: object) -> None:
        return None

    def request_finished(self, record: object, handle: object = None) -> None:
        self.seen.append(record)


class ScriptedDiscovery:
    """A `ReplicaDiscovery` whose answers the test gives."""

    def __init__(self, first: frozenset[str]) -> None:
        self.answer, self.listener, self.closed = first, None, False

    async def start(self, listener: ReadyListener) -> None:
        self.listener = listener  # type: ignore[assignment]
        listener(self.answer)

    def ready(self) -> frozenset[str]:
        return self.answer

    def tell(self, ready: frozenset[str]) -> None:
        self.answer = ready
        assert self.listener is not None
        self.listener(ready)  # type: ignore[unreachable]

    async def close(self) -> None:
        self.closed = True


async def test_the_watch_tells_every_listener_each_answer_and_names_upstreams_without_replicas() -> None:
    told: list[tuple[str, frozenset[str]]] = []
    scripted = ScriptedDiscovery(frozenset({A}))
    watch = ReplicaWatch({"up": scripted, "fixed": StaticReplicas([B])},
                         [lambda u, r: told.append((u, r)), lambda u, r: told.append((u.upper(), r))])
    assert watch.ready("up") is None
    await watch.start()
    assert sorted(told) == sorted([("up", frozenset({A})), ("UP", frozenset({A})),
                                   ("fixed", frozenset({B})), ("FIXED", frozenset({B}))])
    assert watch.without_replicas() == []
    scripted.tell(frozenset())
    assert watch.without_replicas() == ["up"] and watch.ready("up") == frozenset()
    await watch.close()
    assert scripted.closed


async def test_readyz_names_an_upstream_without_a_ready_replica_and_stays_ready() -> None:
    class Status:
        def report(self) -> object:
            raise AssertionError("not asked")

    app = ops_app(lambda: (b"text/plain", b""), lambda: True, Status(), lambda: ["reasoning"])  # type: ignore[arg-type]
    async with AsyncTestClient(app) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.text == "ready\nupstream reasoning: no ready replica\n"
    draining = ops_app(lambda: (b"text/plain", b""), lambda: False, Status(), lambda: ["reasoning"])  # type: ignore[arg-type]
    async with AsyncTestClient(draining) as client:
        assert (await client.get("/readyz")).status_code == 503
    await asyncio.sleep(0)


def test_importing_the_composition_root_loads_no_prometheus_client() -> None:
    """With several workers, prometheus_client's multiprocess mode is chosen at its import, after
    `serve` has set the metrics directory: the load reader (its text parser) is imported late."""
    import subprocess
    import sys

    code = "import sys, bootstrap; sys.exit('prometheus_client' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_dnspython_is_loaded_only_for_an_upstream_that_discovers_its_replicas_by_dns() -> None:
    """Its ~2.4 MB count in every process's memory (the peak RSS benchmark's target)."""
    import subprocess
    import sys

    code = "import sys, bootstrap; sys.exit('dns' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    table = load_config_text(CONFIG.replace(f'urls = ["{A}", "{B}"]', 'dns = "up.example"\nport = 8080'))
    endpoints = table.upstreams["up"].endpoints
    assert endpoints is not None and type(replicas.discovery("up", endpoints)).__name__ == "DnsReplicas"


def test_the_affinity_store_follows_the_backend_and_only_affinity_upstreams_use_it() -> None:
    """None when no upstream uses affinity, this process's with the memory backend, the shared
    one (the gate's Redis and key prefix) with the Redis backend; the services get the upstreams
    that use it (`[endpoints]` and `affinity = "prefix"`)."""
    config = load_config_text(with_endpoints("affinity_max_extra_in_flight = 2"))
    assert replicas.affinity_upstreams(config) == {"up": 2}
    assert isinstance(replicas.affinity_store(config), MemoryAffinityStore)
    off = load_config_text(with_endpoints('affinity = "off"'))
    assert replicas.affinity_upstreams(off) == {} and replicas.affinity_store(off) is None
    shared = load_config_text('[admission]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:6379/0"\n'
                              'key_prefix = "affinity-unit"\n' + CONFIG)
    from adapters.outbound.redis_affinity import RedisAffinityStore

    store = replicas.affinity_store(shared)
    assert isinstance(store, RedisAffinityStore) and store._prefix == "affinity-unit"
    container = bootstrap.Container(config=config)
    assert container.affinity().wanted("up") and not container.affinity().wanted("plain")
    assert container.service()._affinity is container.completions()._affinity is container.affinity()
