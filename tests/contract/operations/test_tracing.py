"""Traces reach a real OTLP/HTTP receiver; an incoming traceparent continues to the stub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from tests.support.processes import Processes, upstream_toml

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver:
    """A minimal OTLP/HTTP trace collector: decodes the protobuf payloads it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.arrived = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        message = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        self.arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def wait_for(self, names: set[str], timeout: float = 15.0) -> dict[str, Span]:
        async with asyncio.timeout(timeout):
            while not names <= {s.name for s in self.spans}:
                self.arrived.clear()
                await self.arrived.wait()
        return {s.name: s for s in self.spans}


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    collector = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", collector.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield collector, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _attrs(span: Span) -> dict[str, object]:
    values: dict[str, object] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        values[kv.key] = list(v.string_value for v in value.array_value.values) if kind == "array_value" \
            else getattr(value, kind)
    return values


async def test_span_tree_and_trace_continuity(procs: Processes, receiver: tuple[Receiver, str],
                                              tmp_path: Path) -> None:
    collector, endpoint = receiver
    log = tmp_path / "stub.log"
    stub = procs.stub(log=log)
    gateway = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], {
        "sequence_slots": 4, "max_in_flight": 2, "queue_depth": 2, "queue_timeout_seconds": 5}),
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "gateway-test"})
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            f"{gateway.url}/llm/v1/messages",
            json={"model": "reasoning", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "x-request-id": "trace-me",
                     "X-Claude-Code-Session-Id": "session-7"},
        )
        assert response.status == 200

    spans = await collector.wait_for({"POST /llm/v1/messages", "gateway.admission", "chat reasoning"})
    server, admission, client = spans["POST /llm/v1/messages"], spans["gateway.admission"], spans["chat reasoning"]
    assert server.trace_id.hex() == TRACE_ID and server.parent_span_id.hex() == PARENT_ID
    assert server.kind == Span.SPAN_KIND_SERVER and client.kind == Span.SPAN_KIND_CLIENT
    for child in (admission, client):
        assert child.trace_id.hex() == TRACE_ID and child.parent_span_id == server.span_id

    server_attrs = _attrs(server)
    assert server_attrs["gateway.surface"] == "anthropic"
    assert server_attrs["gateway.request_id"] == "trace-me"
    assert server_attrs["session.id"] == "session-7"  # an agent client's session, for grouping
    assert server_attrs["http.response.status_code"] == 200
    assert server_attrs["gen_ai.operation.name"] == "chat"
    assert server_attrs["gen_ai.request.model"] == "reasoning"
    assert server_attrs["gen_ai.response.finish_reasons"] == ["max_tokens"]  # max_tokens 8 < 16
    assert server_attrs["gen_ai.usage.output_tokens"] == 8
    assert _attrs(admission)["gateway.admission.outcome"] == "admitted"
    assert _attrs(client)["gen_ai.request.model"] == "reasoning"

    # The header the stub received carries the same trace, with the client span as parent.
    line = next(line for line in log.read_text().splitlines() if "traceparent=" in line)
    traceparent = line.split("traceparent=")[1].split()[0]
    assert traceparent.split("-")[1] == TRACE_ID
    assert traceparent.split("-")[2] == client.span_id.hex()


async def test_no_exporter_no_traceparent(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub(log=log)
    gateway = procs.gateway(upstream_toml("m", stub.url, ["m"]))
    async with aiohttp.ClientSession() as http:
        response = await http.post(f"{gateway.url}/v1/chat/completions", json={"model": "m", "messages": []},
                                   headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
        assert response.status == 200
    assert "traceparent=" not in log.read_text()  # tracing off: no spans, nothing injected


async def test_text_completions_and_embeddings_are_traced_as_themselves(
        procs: Processes, receiver: tuple[Receiver, str]) -> None:
    collector, endpoint = receiver
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"]),
                            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "gateway-test"})
    async with aiohttp.ClientSession() as http:
        for path, body in (("/v1/completions", {"model": "reasoning", "prompt": "x", "max_tokens": 3}),
                           ("/v1/embeddings", {"model": "reasoning", "input": ["a b"]})):
            async with http.post(f"{gateway.url}{path}", json=body) as response:
                assert response.status == 200
    spans = await collector.wait_for({"POST /v1/completions", "POST /v1/embeddings", "text_completion reasoning",
                                      "embeddings reasoning"})
    text, vectors = _attrs(spans["POST /v1/completions"]), _attrs(spans["POST /v1/embeddings"])
    assert text["gen_ai.operation.name"] == "text_completion" and text["gen_ai.usage.output_tokens"] == 3
    assert vectors["gen_ai.operation.name"] == "embeddings" and vectors["gen_ai.usage.input_tokens"] == 2
    assert _attrs(spans["text_completion reasoning"])["gen_ai.request.model"] == "reasoning"
    assert spans["embeddings reasoning"].kind == Span.SPAN_KIND_CLIENT


async def test_the_upstream_span_names_the_replica_of_an_upstream_with_endpoints(
    procs: Processes, receiver: tuple[Receiver, str]
) -> None:
    collector, endpoint = receiver
    stub = procs.stub()
    toml = upstream_toml("reasoning", "http://127.0.0.1:9", ["reasoning"], {
        "sequence_slots": 4, "max_in_flight": 2, "queue_depth": 2, "queue_timeout_seconds": 5})
    toml += f'\n[upstreams.reasoning.endpoints]\nurls = ["{stub.url}"]\nsequence_slots = 2\nmax_in_flight = 2\n'
    gateway = procs.gateway(toml, env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    async with aiohttp.ClientSession() as http:
        response = await http.post(f"{gateway.url}/v1/chat/completions",
                                   json={"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]})
        assert response.status == 200
    client = _attrs((await collector.wait_for({"chat reasoning"}))["chat reasoning"])
    assert (client["server.address"], client["server.port"]) == ("127.0.0.1", stub.port)  # not the url's port 9
    assert client["gateway.endpoint"] == f"127.0.0.1:{stub.port}"
