"""vLLM's token-id members never reach a client: no surface, streamed or not, shows them.

vLLM 0.32 writes `"token_ids": null` in the choices of a chat stream's chunks after the first,
`"prompt_token_ids": null` in its first chunk, both in every choice of a text completion's
chunks (an echoed prompt's ids even unasked), and both in its answers; the stub writes them
where vLLM does (checked here, straight from the stub). Through a real gateway over that stub,
neither name may appear in the raw bytes (httpx and curl) or in the official SDKs' objects of
`/v1/chat/completions`, `/v1/completions`, `/v1/responses` and `/llm/v1/messages`: plain,
streamed, with n > 1, logprobs, an echo, and a model alias (whose frames are re-encoded).
The ids are the gateway's own business: a client's `return_token_ids` is dropped, as every
member a surface does not model is.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import msgspec
import openai
import pytest
from tests.support.processes import Proc, Processes, upstream_toml

MODEL = "tiny"
ALIAS = "tiny-latest"  # an alias: the gateway renames the model in every relayed frame
NAME = b"token_ids"  # in both members' names: `token_ids`, `prompt_token_ids`
USER: list[Any] = [{"role": "user", "content": "count the tokens"}]
ASK = {"return_token_ids": True}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc, Path]]:
    """(the stub, the gateway in front of it, the stub's log of the bodies it received)"""
    workdir = tmp_path_factory.mktemp("token-ids")
    procs = Processes(workdir)
    log = workdir / "stub.log"
    try:
        stub = procs.stub("--tokens", "5", "--log-bodies", log=log)
        extra = 'aliases = ["tiny-*"]\nmax_choices = 4\n'  # an alias; n up to 4
        gateway = procs.gateway(upstream_toml("tiny", stub.url, [MODEL], extra=extra))
        yield stub, gateway, log
    finally:
        procs.stop_all()


def post(url: str, path: str, body: dict[str, Any]) -> bytes:
    answer = httpx.post(url + path, json=body, timeout=20)
    assert answer.status_code == 200, answer.text
    return answer.content


def payloads(raw: bytes) -> list[Any]:
    """The JSON of each `data:` line of an SSE body (`[DONE]` left out)."""
    lines = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", raw
    return [json.loads(line) for line in lines[:-1]]


def names(value: Any) -> set[str]:
    """Every member name in a JSON value, at any depth."""
    if isinstance(value, dict):
        return set(value).union(*(names(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(names(item) for item in value))
    return set()


def hidden(raw: bytes) -> None:
    """Neither member anywhere in a client's bytes."""
    assert NAME not in raw, raw.decode()


def received(log: Path) -> dict[str, Any]:
    """The last body the stub received (the JSON ending its last `--log` line)."""
    lines = [line for line in log.read_text().splitlines() if " body=" in line]
    body: dict[str, Any] = msgspec.json.decode(lines[-1].split(" body=", 1)[1])
    return body


CHAT = {"model": MODEL, "messages": USER, "max_tokens": 4}
TEXT = {"model": MODEL, "prompt": "count the tokens", "max_tokens": 4}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def test_the_stub_writes_them_where_vllm_does(edge: tuple[Proc, Proc, Path]) -> None:
    stub = edge[0]
    chunks = payloads(post(stub.url, "/v1/chat/completions", {**CHAT, **STREAM}))
    assert chunks[0]["prompt_token_ids"] is None and "token_ids" not in chunks[0]["choices"][0]
    assert all(c["choices"][0]["token_ids"] is None for c in chunks[1:] if c["choices"])
    answer = json.loads(post(stub.url, "/v1/chat/completions", CHAT))
    assert answer["prompt_token_ids"] is None and answer["choices"][0]["token_ids"] is None
    echoed = payloads(post(stub.url, "/v1/completions", {**TEXT, **STREAM, "echo": True}))
    assert echoed[0]["choices"][0]["prompt_token_ids"]  # the prompt's ids, unasked
    assert all(c["choices"][0]["token_ids"] is None for c in echoed if c["choices"])
    text = json.loads(post(stub.url, "/v1/completions", TEXT))
    assert text["choices"][0]["token_ids"] is None and text["choices"][0]["prompt_token_ids"] is None


@pytest.mark.parametrize("body", [
    CHAT, {**CHAT, **STREAM}, {**CHAT, "stream": True}, {**CHAT, **STREAM, "n": 2},
    {**CHAT, **STREAM, "model": ALIAS}, {**CHAT, "model": ALIAS, "n": 3},
], ids=["plain", "streamed", "streamed-without-usage", "streamed-n2", "streamed-alias", "plain-alias-n3"])  # fmt: skip
def test_v1_chat_completions_raw(edge: tuple[Proc, Proc, Path], body: dict[str, Any]) -> None:
    stub, gateway, _ = edge
    raw = post(gateway.url, "/v1/chat/completions", body)
    hidden(raw)
    if not body.get("stream"):
        answer = json.loads(raw)
        assert len(answer["choices"]) == body.get("n", 1) and answer["model"] == body["model"]
        assert "stop_reason" in answer["choices"][0]  # vLLM's other members are still relayed
        return
    chunks = payloads(raw)
    # Every chunk the stub wrote is relayed (but the usage chunk the client did not ask for),
    # with every other member: the same chunks with the ids taken out.
    straight = payloads(post(stub.url, "/v1/chat/completions", {**body, **STREAM, "model": MODEL}))
    if "stream_options" not in body:
        straight = straight[:-1]
    for chunk in straight:
        chunk.pop("prompt_token_ids", None)
        for choice in chunk["choices"]:
            choice.pop("token_ids", None)

    def same(chunk: dict[str, Any]) -> dict[str, Any]:
        return {**chunk, "id": "", "created": 0, "model": ""}

    assert [same(c) for c in chunks] == [same(c) for c in straight]
    assert {c["model"] for c in chunks} == {body["model"]}


@pytest.mark.parametrize("body", [
    TEXT, {**TEXT, **STREAM}, {**TEXT, **STREAM, "echo": True}, {**TEXT, **STREAM, "echo": True, "n": 2},
    {**TEXT, **STREAM, "logprobs": 1}, {**TEXT, "echo": True, "logprobs": 1}, {**TEXT, **STREAM, "model": ALIAS},
], ids=["plain", "streamed", "streamed-echo", "streamed-echo-n2", "streamed-logprobs", "plain-echo-logprobs",
        "streamed-alias"])  # fmt: skip
def test_v1_completions_raw(edge: tuple[Proc, Proc, Path], body: dict[str, Any]) -> None:
    gateway = edge[1]
    raw = post(gateway.url, "/v1/completions", body)
    hidden(raw)
    if body.get("stream"):
        chunks = payloads(raw)
        assert chunks[0]["choices"][0]["text"].startswith("count the tokens" if body.get("echo") else "alpha")
        assert all("stop_reason" in choice for c in chunks for choice in c["choices"])
        if body.get("logprobs"):
            assert all(choice["logprobs"]["tokens"] for c in chunks for choice in c["choices"] if choice["text"])
    elif body.get("logprobs"):
        assert json.loads(raw)["choices"][0]["logprobs"]["tokens"]


@pytest.mark.parametrize("path", ["/v1/responses", "/llm/v1/messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_other_surfaces_raw(edge: tuple[Proc, Proc, Path], path: str, stream: bool) -> None:
    gateway = edge[1]
    body: dict[str, Any] = {"model": MODEL, "input": "count the tokens", "max_output_tokens": 4, "stream": stream}
    if path == "/llm/v1/messages":
        body = {"model": MODEL, "messages": USER, "max_tokens": 4, "stream": stream}
    raw = post(gateway.url, path, body)
    hidden(raw)
    assert b"alpha" in raw


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {**CHAT, **STREAM, "n": 2}), ("/v1/completions", {**TEXT, **STREAM, "echo": True}),
])  # fmt: skip
def test_curl_sees_none(edge: tuple[Proc, Proc, Path], path: str, body: dict[str, Any]) -> None:
    gateway = edge[1]
    done = subprocess.run(["curl", "-sS", "-N", "--max-time", "20", gateway.url + path, "-H",
                           "content-type: application/json", "-d", json.dumps(body)],
                          capture_output=True, timeout=30, check=True)  # fmt: skip
    hidden(done.stdout)
    assert len(payloads(done.stdout)) > 4


def test_the_openai_sdk_sees_none(edge: tuple[Proc, Proc, Path]) -> None:
    gateway = edge[1]
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)
    seen: list[Any] = [client.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, n=2)]
    seen += client.chat.completions.create(model=ALIAS, messages=USER, max_tokens=4, stream=True,
                                           stream_options={"include_usage": True})  # fmt: skip
    seen.append(client.completions.create(model=MODEL, prompt="count", max_tokens=4, echo=True))
    seen += client.completions.create(model=MODEL, prompt="count", max_tokens=4, echo=True, stream=True)
    seen.append(client.responses.create(model=MODEL, input="count", max_output_tokens=4))
    seen += client.responses.create(model=MODEL, input="count", max_output_tokens=4, stream=True)
    assert len(seen) > 10
    for item in seen:
        assert not names(item.model_dump()) & {"token_ids", "prompt_token_ids"}, item


def test_the_anthropic_sdk_sees_none(edge: tuple[Proc, Proc, Path]) -> None:
    gateway = edge[1]
    client = anthropic.Anthropic(base_url=f"{gateway.url}/llm", api_key="unused", max_retries=0, timeout=20)
    seen: list[Any] = [client.messages.create(model=MODEL, max_tokens=4, messages=USER)]
    seen += client.messages.create(model=MODEL, max_tokens=4, messages=USER, stream=True)
    assert len(seen) > 4
    for item in seen:
        assert not names(item.model_dump()) & {"token_ids", "prompt_token_ids"}, item


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {**CHAT, **STREAM}), ("/v1/chat/completions", CHAT), ("/v1/completions", TEXT),
    ("/v1/completions", {**TEXT, **STREAM}), ("/v1/responses", {"model": MODEL, "input": "count"}),
    ("/llm/v1/messages", {"model": MODEL, "messages": USER, "max_tokens": 4}),
])  # fmt: skip
def test_a_clients_return_token_ids_is_dropped(edge: tuple[Proc, Proc, Path], path: str,
                                               body: dict[str, Any]) -> None:
    _, gateway, log = edge
    hidden(post(gateway.url, path, {**body, **ASK}))
    assert "return_token_ids" not in received(log)
