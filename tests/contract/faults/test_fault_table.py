"""The upstream fault table: one test per fault and surface, real processes.

One stub per fault kind (`gateway stub --fault KIND`), plus an upstream on a port nobody
listens on ("refused"), all behind ONE gateway, each upstream capped (admission table)
with short `first_byte_timeout_seconds` / `idle_timeout_seconds`. Each test sends one
request and checks the documented outcome (docs/errors.md, "Upstream faults"):

- the failure happens before the gateway's response started: that status, in the
  surface's error shape (problem+json on `/v1`, Anthropic error JSON on `/llm`);
- after it started (a stream already relayed some chunks): the surface's terminal error
  frame (`/v1`: `data: {"error": ...}` then `data: [DONE]`; `/llm`: `event: error`
  and no `message_stop`);

and in every case the upstream's slot is free afterwards, nothing was a 500, and no
message names what is behind the gateway (addresses, a proxy's page, transport errors).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial

import aiohttp
import pytest
from tests.contract.faults.fault_support import Reply, data_frames, metrics, send, statuses, until_idle
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, free_port, upstream_toml

from stub.faults import KINDS

TIMEOUTS = "connect_timeout_seconds = 1\nfirst_byte_timeout_seconds = 0.5\nidle_timeout_seconds = 0.5\n"
ADMISSION: dict[str, float] = {"sequence_slots": 3, "max_in_flight": 2, "queue_depth": 2, "queue_timeout_seconds": 5}
FAULTS = ("refused", *KINDS)
SURFACES = (("v1", False), ("v1", True), ("llm", False), ("llm", True))
ANTHROPIC_TYPES = {400: "invalid_request_error", 502: "api_error", 504: "timeout_error"}


@dataclass(frozen=True)
class Outcome:
    """`status` of the response; 200 means a stream ending with an error frame of `kind`."""

    status: int
    kind: str


def _before(status: int, kind: str) -> tuple[Outcome, Outcome]:
    return Outcome(status, kind), Outcome(status, kind)


# fault -> (non-streaming outcome, streaming outcome); the same on both surfaces.
TABLE: dict[str, tuple[Outcome, Outcome]] = {
    "refused": _before(502, "upstream-unavailable"),
    "reset-before-headers": _before(502, "upstream-unavailable"),
    "reset-mid-stream": (Outcome(502, "upstream-error"), Outcome(200, "upstream-error")),
    "stall-before-headers": _before(504, "upstream-timeout"),
    "stall-mid-stream": (Outcome(504, "upstream-timeout"), Outcome(200, "upstream-timeout")),
    "malformed-sse": (Outcome(502, "upstream-protocol-error"), Outcome(200, "upstream-protocol-error")),
    "http-4xx": _before(400, "context-length-exceeded"),
    "http-5xx": _before(502, "upstream-error"),
    "http-5xx-html": _before(502, "upstream-error"),
    "truncated": (Outcome(502, "upstream-protocol-error"), Outcome(200, "upstream-protocol-error")),
    # a replica killed mid-answer: non-stream, nothing was answered; a stream relayed its first tokens
    "die-mid-stream": (Outcome(502, "upstream-unavailable"), Outcome(200, "upstream-error")),
}
KIND_STATUS = {"upstream-unavailable": 502, "upstream-error": 502, "upstream-protocol-error": 502,
               "upstream-timeout": 504, "context-length-exceeded": 400}  # fmt: skip
# OpenAI's own code where it has one (clients check for it); else the problem type's slug.
OPENAI_CODES = {"context-length-exceeded": "context_length_exceeded"}


# What a client must never see: the stub's address, the proxy page's, its server, aiohttp's words.
# The proxy page's port with its colon: a bare "8012" turns up in random request ids now and then.
INTERNAL = ("127.0.0.1", "10.42.7.13", ":8012", "nginx", "<html", "svc.cluster", "Error(", "errno",
            "ContentLength", "payload", "Connection reset")


def assert_nothing_internal(text: str) -> None:
    for word in INTERNAL:
        assert word.lower() not in text.lower(), f"{word!r} reached the client: {text[:300]}"


def upstream_name(fault: str) -> str:
    return "f_" + fault.replace("-", "_")


@pytest.fixture(scope="module")
def fault_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    processes = Processes(tmp_path_factory.mktemp("faults"))
    try:
        faulty = [fault for fault in FAULTS if fault != "refused"]
        stubs = processes.together(partial(processes.stub, "--fault", fault, "--tokens", "8") for fault in faulty)
        urls = {fault: stub.url for fault, stub in zip(faulty, stubs, strict=True)}
        urls["refused"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        toml = "".join(upstream_toml(upstream_name(fault), urls[fault], [fault], ADMISSION, TIMEOUTS)
                       for fault in FAULTS)
        yield processes.gateway(toml)
    finally:
        processes.stop_all()


@pytest.fixture(scope="module")
def gateway_url(fault_gateway: Proc) -> str:
    return fault_gateway.url


@pytest.fixture(scope="module")
def ops_url(fault_gateway: Proc) -> str:
    return fault_gateway.ops_url


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


def check_error_response(reply: Reply, surface: str, expected: Outcome) -> str:
    """The documented status in the surface's shape; returns the error message."""
    assert reply.status == expected.status, reply.text
    body = reply.json()
    assert_nothing_internal(reply.text)
    if surface == "v1":
        assert reply.content_type == "application/problem+json", reply.content_type
        assert body["status"] == expected.status and body["type"].endswith("/" + expected.kind), body
        assert body["error"]["code"] == OPENAI_CODES.get(expected.kind, expected.kind), body
        return str(body["error"]["message"])
    assert reply.content_type == "application/json", reply.content_type
    assert body["type"] == "error", body
    assert body["error"]["type"] == ANTHROPIC_TYPES[expected.status], body
    return str(body["error"]["message"])


def check_error_frame(reply: Reply, surface: str, expected: Outcome) -> None:
    """A 200 stream that relayed some chunks, then ended with the surface's error frame."""
    assert reply.status == 200, reply.text
    assert reply.content_type == "text/event-stream", reply.content_type
    assert_nothing_internal(reply.text)
    if surface == "v1":
        frames = data_frames(reply.body)
        assert len(frames) >= 3 and frames[-1] == "[DONE]", frames
        chunks = [json.loads(f) for f in frames[:-2]]
        assert chunks and all(c.get("object") == "chat.completion.chunk" for c in chunks), frames
        error = json.loads(frames[-2])["error"]
        assert error["code"] == expected.kind and error["type"] == "server_error", error
        assert error["message"], error
        return
    events = check_anthropic_stream(reply.body)  # the grammar: exactly one terminal event
    names = [e.name for e in events]
    assert names[0] == "message_start" and names[-1] == "error" and "message_stop" not in names, names
    assert events[-1].data["error"]["type"] == ANTHROPIC_TYPES[KIND_STATUS[expected.kind]], events[-1]


@pytest.mark.parametrize(("surface", "stream"), SURFACES, ids=["v1", "v1-stream", "llm", "llm-stream"])
@pytest.mark.parametrize("fault", FAULTS)
async def test_fault_maps_to_documented_outcome(
    gateway_url: str, ops_url: str, session: aiohttp.ClientSession, fault: str, surface: str, stream: bool
) -> None:
    expected = TABLE[fault][1 if stream else 0]
    reply = await send(session, gateway_url, surface, fault, stream)
    assert reply.status != 500, reply.text
    if expected.status == 200:
        check_error_frame(reply, surface, expected)
    else:
        message = check_error_response(reply, surface, expected)
        if fault == "http-4xx":  # vLLM's context-length 400 (8000 + 1000 > 8192), in each API's words
            if surface == "v1":
                assert "maximum context length is 8192 tokens" in message, message
            else:
                expected_start = "input length and `max_tokens` exceed context limit: 8000 + 1000 > 8192"
                assert message.startswith(expected_start), message
        if fault == "http-5xx-html":  # not vLLM's shape: the status only, never the page
            assert message == f"upstream '{upstream_name(fault)}' answered HTTP 502", message
    await until_idle(session, ops_url, upstream_name(fault))
    assert "500" not in statuses(await metrics(session, ops_url))
