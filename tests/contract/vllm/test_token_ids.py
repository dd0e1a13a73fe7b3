"""vLLM's token-id members never reach a `/v1` client, against the real vLLM.

vLLM 0.32 writes `"token_ids": null` in the choices of a chat stream's chunks, `"prompt_token_ids":
null` in its first chunk, both in every choice of a text completion's chunks (an echoed prompt's
ids, unasked) and in its answers: checked here straight from vLLM, so the test means something.
Through the gateway the raw bytes (httpx, no SDK in between) hold neither, streamed or not, with
n > 1, logprobs and an echo, while vLLM's other members are still relayed (`prompt_text`, `logprobs`,
`stop_reason`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.contract.vllm.conftest import vllm_toml
from tests.support.processes import Proc, Processes
from tests.support.real_vllm import MODEL, Fleet, VllmServer

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "which ids"}], "max_tokens": 4, "logprobs": True,
        "n": 2}  # fmt: skip
# (vLLM 0.32 fails a completion stream with echo, logprobs and n > 1 together: a 500 frame)
TEXT = {"model": MODEL, "prompt": "which ids", "max_tokens": 4, "echo": True, "n": 2}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def upstream(vllm_fleet: Fleet) -> VllmServer:
    return vllm_fleet["main"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: VllmServer) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("vllm-token-ids"))
    try:
        yield procs.gateway(vllm_toml(upstream, extra="max_choices = 2\n"))
    finally:
        procs.stop_all()


def post(url: str, path: str, body: dict[str, Any]) -> bytes:
    answer = httpx.post(url + path, json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.content


def frames(raw: bytes) -> list[Any]:
    """The JSON of every `data:` line of an SSE body, `[DONE]` (last) left out."""
    lines = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", raw
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)])
def test_raw_frames_and_answers_have_no_token_ids(gateway: Proc, upstream: VllmServer, path: str,
                                                  body: dict[str, Any]) -> None:
    relayed = {}
    for stream in (True, False):
        asked = {**body, **STREAM} if stream else body
        assert b'"token_ids":null' in post(upstream.url, path, asked)  # vLLM writes them, unasked
        relayed[stream] = post(gateway.url, path, asked)
        assert b"token_ids" not in relayed[stream], relayed[stream].decode()
    assert json.loads(relayed[False])["choices"][1]["stop_reason"] is None
    chunks = frames(relayed[True])
    choices = [choice for chunk in chunks for choice in chunk["choices"]]
    assert {choice["index"] for choice in choices} == {0, 1}
    assert any("stop_reason" in choice for choice in choices)
    if path == "/v1/chat/completions":
        assert chunks[0]["prompt_text"] is None  # vLLM's own member beside the ids, still relayed
        assert all(choice["logprobs"]["content"] for choice in choices if choice["delta"].get("content"))
    else:
        assert chunks[0]["choices"][0]["text"].startswith("which ids")  # the echo, its ids gone
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
