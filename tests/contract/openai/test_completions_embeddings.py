"""`/v1/completions` and `/v1/embeddings` with the official `openai` SDK, through a real gateway.

Upstreams: `gateway stub` processes (text, fill in the middle with `suffix`, streams, vectors)
and a capturing upstream in this process, to show that only modelled fields reach an upstream
and that vLLM's own refusals (it refuses `suffix`) come back as they are.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from tests.support.capture_upstream import CaptureServer
from tests.support.processes import Proc, Processes, upstream_toml

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureServer]:
    server = CaptureServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, capture: CaptureServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("completions"))
    try:
        coder, embedder = procs.together([procs.stub, procs.stub])  # an embedding model is usually its own upstream
        toml = (upstream_toml("coder", coder.url, ["coder"], extra='aliases = ["coder-*"]\nmax_output_tokens = 64\n')
                + upstream_toml("embed", embedder.url, ["embed"])
                + upstream_toml("capture", capture.url, ["capture"]))  # fmt: skip
        yield procs.gateway(toml)
    finally:
        procs.stop_all()


@pytest.fixture
def client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)


# --- text completions ----------------------------------------------------------------------


def test_completion(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="coder", prompt="def add(a, b):", max_tokens=4)
    assert answer.object == "text_completion" and answer.model == "coder"
    choice = answer.choices[0]
    assert (choice.text, choice.finish_reason) == ("alpha bravo charlie delta", "length")
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (3, 4)


def test_fill_in_the_middle_with_a_suffix(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="coder", prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))",
                                       max_tokens=3)
    assert answer.choices[0].text == "papa oscar november"  # the stub's middle (its words backwards)


@pytest.mark.parametrize("suffix", [None, "\n}"])
def test_streamed_completion(client: openai.OpenAI, suffix: str | None) -> None:
    plain = client.completions.create(model="coder", prompt="x", suffix=suffix, max_tokens=5)
    chunks = list(client.completions.create(model="coder", prompt="x", suffix=suffix, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    quiet = list(client.completions.create(model="coder", prompt="x", max_tokens=2, stream=True))
    assert all(c.usage is None for c in quiet) and quiet[-1].choices[0].finish_reason == "length"


def test_echo_logprobs_stop_and_an_alias(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="coder-7b", prompt="go ", echo=True, logprobs=1, stop=["delta"])
    choice = answer.choices[0]
    assert answer.model == "coder-7b"  # the name the client asked for, not the upstream's
    assert choice.text == "go alpha bravo charlie " and choice.finish_reason == "stop"
    assert choice.logprobs is not None and choice.logprobs.tokens == ["alpha", " bravo", " charlie", " "]


@pytest.mark.parametrize(("extra", "param"), [
    ({"n": 2}, "n"), ({"best_of": 3}, "best_of"), ({"prompt": [1, 2]}, "prompt"),
    ({"logit_bias": {"1": 500}}, "logit_bias"), ({"presence_penalty": 3}, "presence_penalty"),
    ({"prompt": []}, "prompt"), ({"max_tokens": 65}, "max_tokens"), ({"logprobs": -1}, "logprobs"),
])
def test_refusals_name_the_field(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    body: dict[str, Any] = {"model": "coder", "prompt": "x", **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**body)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param
    assert caught.value.response.headers["content-type"] == "application/problem+json"


def test_only_modelled_fields_reach_the_upstream(client: openai.OpenAI, capture: CaptureServer) -> None:
    capture.requests.clear()
    client.completions.create(model="capture", prompt="x", suffix="y", max_tokens=3, temperature=0.5, top_p=0.9,
                              stop="z", seed=7, presence_penalty=0.1, frequency_penalty=0.2, user="u", echo=True,
                              logprobs=2, extra_body={"guided_json": {"type": "object"}, "priority": -100})
    list(client.completions.create(model="capture", prompt="x", stream=True))
    (path, plain), (_, stream) = capture.requests
    assert path == "/v1/completions"
    assert plain == {"model": "capture", "prompt": "x", "suffix": "y", "max_tokens": 3, "temperature": 0.5,
                     "top_p": 0.9, "logprobs": 2, "seed": 7, "presence_penalty": 0.1, "frequency_penalty": 0.2,
                     "user": "u", "stop": ["z"], "echo": True, "guided_json": {"type": "object"}}  # allowlisted
    assert stream == {"model": "capture", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}}


def test_vllms_refusal_of_suffix_comes_back_as_it_is(client: openai.OpenAI, capture: CaptureServer) -> None:
    refusal = {"error": {"message": "suffix is not currently supported", "type": "BadRequestError", "param": None,
                         "code": 400}}
    capture.refusals["/v1/completions"] = (400, refusal)
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="capture", prompt="x", suffix="y")
    finally:
        capture.refusals.clear()
    assert caught.value.message.endswith("suffix is not currently supported")


# --- embeddings ---------------------------------------------------------------------------


def test_embeddings_with_a_list_and_dimensions(client: openai.OpenAI) -> None:
    answer = client.embeddings.create(model="embed", input=["the cat", "a dog sat", "the cat"], dimensions=8)
    assert answer.object == "list" and answer.model == "embed" and [d.index for d in answer.data] == [0, 1, 2]
    vectors = [d.embedding for d in answer.data]
    assert all(len(v) == 8 for v in vectors)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]  # deterministic, from the input's hash
    assert answer.usage.prompt_tokens == 7 and answer.usage.total_tokens == 7


def test_embeddings_as_floats_and_base64(gateway: Proc, client: openai.OpenAI) -> None:
    sdk = client.embeddings.create(model="embed", input="hello")  # the SDK asks for base64 and decodes it
    raw = httpx.post(f"{gateway.url}/v1/embeddings", json={"model": "embed", "input": "hello"}).json()
    assert len(sdk.data[0].embedding) == 32
    assert raw["data"][0]["embedding"] == pytest.approx(sdk.data[0].embedding, abs=1e-6)
    encoded = httpx.post(f"{gateway.url}/v1/embeddings",
                         json={"model": "embed", "input": "hello", "encoding_format": "base64"}).json()
    decoded = struct.unpack("<32f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert decoded == pytest.approx(raw["data"][0]["embedding"], abs=1e-6)


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"), ({"input": [[1, 2]]}, "input"), ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
])
def test_embedding_refusals_name_the_field(gateway: Proc, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(f"{gateway.url}/v1/embeddings", json={"model": "embed", **body})
    assert reply.status_code == 400 and reply.headers["content-type"] == "application/problem+json"
    assert reply.json()["error"]["param"] == param


def test_only_modelled_embedding_fields_reach_the_upstream(client: openai.OpenAI, capture: CaptureServer) -> None:
    capture.requests.clear()
    answer = client.embeddings.create(model="capture", input=["a", "b"], dimensions=2, encoding_format="float",
                                      user="u", extra_body={"truncate_prompt_tokens": 5})
    assert [d.embedding for d in answer.data] == [[0.6, 0.8], [0.6, 0.8]]
    assert capture.requests == [("/v1/embeddings", {"model": "capture", "input": ["a", "b"],
                                                    "encoding_format": "float", "dimensions": 2, "user": "u"})]


def test_the_other_v1_paths_stay_404(gateway: Proc) -> None:
    for path in ("/v1/audio/speech", "/v1/images/generations", "/v1/files", "/v1/moderations"):
        reply = httpx.post(f"{gateway.url}{path}", json={})
        assert reply.status_code == 404 and reply.headers["content-type"] == "application/problem+json", path
    assert json.loads(httpx.get(f"{gateway.url}/v1/completions").text)["status"] == 405
