"""The official `openai` SDK against a real `gateway serve` and real upstreams.

Upstreams: `gateway stub` processes (plain, `--error-rate 1`, `--hold` for a full
queue), a port nobody listens on, and a small capturing upstream in this process
that records the bodies it receives, to prove client parameters reach the upstream.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import openai
import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionToolParam,
)
from tests.support.processes import Proc, Processes, free_port, upstream_toml

MAX_BODY = 65536
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]

# --- a capturing upstream (vLLM-shaped answers, with fields canonical does not name) ---

LOGPROBS = {"content": [{"token": "ok", "logprob": -0.1, "bytes": [111, 107], "top_logprobs": []}]}
COMPLETION = {
    "id": "chatcmpl-cap", "object": "chat.completion", "created": 1, "model": "capture",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
                 "logprobs": LOGPROBS, "stop_reason": None}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
}  # fmt: skip
_HEAD = {"id": "chatcmpl-cap", "object": "chat.completion.chunk", "created": 1, "model": "capture"}
FRAMES = [
    {**_HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": None},
    {**_HEAD, "choices": [{"index": 0, "delta": {"content": "ok"}, "logprobs": LOGPROBS}], "usage": None},
    {**_HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None},
    {**_HEAD, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}},
]
SSE = b"".join(b"data: " + msgspec.json.encode(f) + b"\n\n" for f in FRAMES) + b"data: [DONE]\n\n"


class CaptureHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CaptureServer

    def do_POST(self) -> None:
        body = msgspec.json.decode(self.rfile.read(int(self.headers["content-length"])))
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


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureServer]:
    server = CaptureServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, capture: CaptureServer) -> Iterator[Proc]:
    """One gateway over every kind of upstream; each model name picks one."""
    procs = Processes(tmp_path_factory.mktemp("openai-sdk"))
    try:
        stub, broken = procs.together([procs.stub, partial(procs.stub, "--error-rate", "1")])
        toml = (f"max_body_bytes = {MAX_BODY}\n"
                + upstream_toml("reasoning", stub.url, ["reasoning"])
                + upstream_toml("broken", broken.url, ["broken"])
                + upstream_toml("closed", f"http://127.0.0.1:{free_port()}", ["closed"])
                + upstream_toml("capture", capture.url, ["capture"]))  # fmt: skip
        yield procs.gateway(toml)
    finally:
        procs.stop_all()


@pytest.fixture
def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)


# --- success paths -----------------------------------------------------------------------


def test_chat_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="reasoning", messages=USER)
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert choice.message.content is not None and choice.message.content.startswith("alpha bravo")
    assert choice.finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == 16


def test_stream_with_usage_ends_with_the_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="reasoning", messages=USER, stream=True, stream_options={"include_usage": True}))  # fmt: skip
    *body, last = chunks
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 16
    assert all(c.usage is None and c.choices for c in body)
    text = "".join(c.choices[0].delta.content or "" for c in body)
    assert text.startswith("alpha bravo") and len(text.split()) == 16
    assert [c.choices[0].finish_reason for c in body][-1] == "stop"


def test_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="reasoning", messages=USER, stream=True))
    assert chunks and all(c.choices and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_tool_call(client: openai.OpenAI) -> None:
    tool: ChatCompletionToolParam = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
    completion = client.chat.completions.create(
        model="reasoning", messages=USER, tools=[tool], tool_choice="required")  # fmt: skip
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert msgspec.json.decode(call.function.arguments) == {"city": "x"}


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert sorted(m.id for m in models) == ["broken", "capture", "closed", "reasoning"]
    assert {m.owned_by for m in models} == {"gateway"}


def test_client_parameters_reach_the_upstream_and_its_extra_fields_come_back(
    client: openai.OpenAI, capture: CaptureServer
) -> None:
    extra = {"min_p": 0.05, "repetition_penalty": 1.1, "chat_template_kwargs": {"enable_thinking": False}}
    completion = client.chat.completions.create(
        model="capture", messages=USER, seed=7, logprobs=True, top_logprobs=2, n=1, presence_penalty=0.5,
        response_format={"type": "json_object"}, reasoning_effort="low", extra_body=extra)  # fmt: skip
    sent = capture.bodies[-1]
    expected = {"seed": 7, "logprobs": True, "top_logprobs": 2, "presence_penalty": 0.5,
                "response_format": {"type": "json_object"}, "reasoning_effort": "low", **extra}  # fmt: skip
    assert {k: sent.get(k) for k in expected} == expected
    assert "n" not in sent  # n = 1 is vLLM's default: only other values are sent
    logprobs = completion.choices[0].logprobs  # relayed although canonical has no such field
    assert logprobs is not None and logprobs.content is not None and logprobs.content[0].token == "ok"


def test_upstream_is_always_asked_for_usage_but_the_client_only_gets_it_on_request(
    client: openai.OpenAI, capture: CaptureServer
) -> None:
    chunks = list(client.chat.completions.create(model="capture", messages=USER, stream=True))
    assert capture.bodies[-1]["stream_options"]["include_usage"] is True
    assert [c.choices[0].delta.content for c in chunks] == ["", "ok", None]
    assert chunks[1].choices[0].logprobs is not None  # native frames relayed byte for byte
    options: Any = {"include_usage": True, "continuous_usage_stats": True}  # a vLLM extension
    chunks = list(client.chat.completions.create(model="capture", messages=USER, stream=True,
                                                 stream_options=options))  # fmt: skip
    assert capture.bodies[-1]["stream_options"] == options
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


# --- error paths ---------------------------------------------------------------------------


def _problem(error: openai.APIStatusError, status: int, code: str) -> dict[str, Any]:
    assert error.status_code == status and error.code == code
    assert error.response.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = error.response.json()
    assert doc["status"] == status and doc["type"] == f"https://api.riotpiao.com/problems/{code}"
    assert doc["instance"] == f"urn:request:{error.request_id}"
    assert doc["detail"] in error.message  # openai-python shows our message
    return doc


def test_malformed_json_is_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/chat/completions", cast_to=ChatCompletion, content=b'{"model": "reasoning",',
                    options={"headers": {"content-type": "application/json"}})  # fmt: skip
    _problem(info.value, 400, "invalid-request")


@pytest.mark.parametrize(
    ("body", "param"),
    [({"model": "reasoning", "messages": USER, "temperature": "hot"}, "temperature"),
     ({"messages": USER}, "model"),
     ({"model": "reasoning", "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
      "messages[0].content[0].type")],
)  # fmt: skip
def test_wrong_types_are_bad_request_naming_the_field(
    client: openai.OpenAI, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/chat/completions", cast_to=ChatCompletion, body=body)
    assert info.value.param == param and param in _problem(info.value, 400, "invalid-request")["detail"]


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_is_not_found(client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=USER, stream=stream)
    assert "gpt-9" in _problem(info.value, 404, "model-not-found")["detail"]


def test_body_too_large_is_413(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="reasoning", messages=[{"role": "user", "content": "x" * MAX_BODY}]
        )
    _problem(info.value, 413, "payload-too-large")


@pytest.mark.parametrize(
    ("model", "code"), [("closed", "upstream-unavailable"), ("broken", "upstream-error")]
)
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_failures_are_502(client: openai.OpenAI, model: str, code: str, stream: bool) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=model, messages=USER, stream=stream)
    _problem(info.value, 502, code)


def test_upstream_4xx_passes_through_with_its_status_and_message(client: openai.OpenAI) -> None:
    tool: ChatCompletionToolParam = {"type": "function", "function": {"name": "get_weather"}}
    choice: ChatCompletionNamedToolChoiceParam = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="reasoning", messages=USER, tools=[tool], tool_choice=choice)
    assert "nope" in _problem(info.value, 400, "upstream-rejected")["detail"]


# --- a full queue ---------------------------------------------------------------------------


def _wait_slots(gateway: Proc, count: float, timeout: float = 5.0) -> None:
    """Poll the gateway's `gateway_upstream_slots_in_use` gauge until it reads `count`."""
    series, deadline = 'gateway_upstream_slots_in_use{upstream="reasoning"}', time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{gateway.ops_url}/metrics", timeout=2) as response:
            lines = response.read().decode().splitlines()
        if any(line.startswith(series) and float(line.split()[-1]) == count for line in lines):
            return
        assert time.monotonic() < deadline, f"slots in use never became {count}"
        time.sleep(0.02)


@pytest.fixture
def capped(procs: Processes) -> Proc:
    """One slot, no queue, and a stub that holds each answer 3 s."""
    stub = procs.stub("--hold", "3")
    admission: dict[str, float] = {
        "sequence_slots": 2,
        "max_in_flight": 1,
        "queue_depth": 0,
        "queue_timeout_seconds": 5,
    }
    return procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission))


def test_full_queue_is_503_with_retry_after(capped: Proc) -> None:
    client = openai.OpenAI(base_url=f"{capped.url}/v1", api_key="unused", max_retries=0, timeout=20)
    holder = threading.Thread(target=lambda: client.chat.completions.create(model="reasoning", messages=USER))
    holder.start()
    try:
        _wait_slots(capped, 1)
        for stream in (False, True):  # a stream that has sent nothing yet gets the status too
            with pytest.raises(openai.InternalServerError) as info:
                client.chat.completions.create(model="reasoning", messages=USER, stream=stream)
            _problem(info.value, 503, "queue-full")
            assert int(info.value.response.headers["retry-after"]) >= 1
    finally:
        holder.join(timeout=10)


def test_hang_up_while_waiting_for_the_upstream_frees_the_slot(capped: Proc) -> None:
    client = openai.OpenAI(base_url=f"{capped.url}/v1", api_key="unused", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):  # the client gives up while the stub holds the answer
        client.chat.completions.create(model="reasoning", messages=USER, stream=True)
    _wait_slots(capped, 0, timeout=1.5)  # well before the stub's 3 s hold ends
