"""The stub against the real vLLM: the same requests to both, the shapes of their answers
compared (every member's path and JSON type, plain answers, stream chunks, errors, /tokenize,
/v1/models, the scheduler gauges). The stub stands in for vLLM in most of the suite; where the
two disagree vLLM is right, and this test keeps the stub from drifting away again.

A shape is the set of `path:type` of every value (lists by their items: `choices[].index:int`).
The stub may leave out what the gateway never reads: each such member is listed in `VLLM_ONLY`
with the surface it belongs to. Everything else must match both ways, types included (a `null`
on either side matches any type)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.processes import Proc, Processes
from tests.support.real_vllm import MAX_MODEL_LEN, MAX_NUM_SEQS, MODEL, REASONING_MODEL, Fleet, VllmServer

# vLLM's members the stub leaves out (beside those vLLM sends as null: nothing said): nothing in
# the gateway reads them. By surface; "*" for every answer.
VLLM_ONLY = {
    "*": {"system_fingerprint", "usage.prompt_tokens_details.created_cache_tokens"},
    "tokenize": set(),
    "models": {"data[].permission"},
    # The stub's text completions do not model the prefix cache: their usage has no details.
    "completion": {"usage.prompt_tokens_details"},
}


def allowed(name: str) -> set[str]:
    return VLLM_ONLY["*"] | VLLM_ONLY.get(name, set())


def shape(value: Any, path: str = "") -> dict[str, str]:
    """`path -> JSON type` of every leaf value (an empty list or object is a leaf)."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(shape(item, f"{path}.{key}" if path else key))
        return out
    if isinstance(value, list) and value:
        out = {}
        for item in value:
            out.update(shape(item, f"{path}[]"))
        return out
    kind = {dict: "object", list: "list", str: "string", bool: "bool", int: "number", float: "number",
            type(None): "null"}[type(value)]  # fmt: skip
    return {path: kind}


def differences(stub: dict[str, str], vllm: dict[str, str], vllm_only: set[str]) -> list[str]:
    """What one shape has and the other has not, and types that differ (null matches any)."""

    def under(path: str, parent: str) -> bool:
        return path == parent or path.startswith((parent + ".", parent + "[]"))

    def present(path: str, other: dict[str, str]) -> bool:  # itself, deeper, or a null where it starts
        return any(under(q, path) or (other[q] == "null" and under(path, q)) for q in other)

    out = [f"stub only: {p}" for p in stub if not present(p, vllm)]
    out += [f"vllm only: {p}" for p, kind in vllm.items() if kind != "null" and not present(p, stub)
            and not any(under(p, only) for only in vllm_only)]  # fmt: skip
    out += [f"type of {p}: stub {stub[p]}, vllm {vllm[p]}" for p in stub
            if p in vllm and "null" not in (stub[p], vllm[p]) and stub[p] != vllm[p]]  # fmt: skip
    return sorted(out)


def call(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def events(raw: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` as the string."""
    out: list[Any] = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, vllm_fleet: Fleet) -> Iterator[tuple[Proc, VllmServer]]:
    procs = Processes(tmp_path_factory.mktemp("stub-vs-vllm"))
    try:
        # as vLLM runs: its context, its places, prefix caching with prompt-token details
        yield procs.stub("--models", MODEL, "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs",
                         str(MAX_NUM_SEQS), "--prefix-cache"), vllm_fleet["main"]  # fmt: skip
    finally:
        procs.stop_all()


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "shape of an answer"}], "max_tokens": 5}
TOOL = {"type": "function", "function": {"name": "get", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
FORCED = {**CHAT, "temperature": 0, "max_tokens": 40, "tools": [TOOL],
          "tool_choice": {"type": "function", "function": {"name": "get"}}}  # fmt: skip


@pytest.mark.parametrize(("name", "path", "body"), [
    ("chat", "/v1/chat/completions", CHAT),
    ("chat", "/v1/chat/completions", FORCED),
    ("completion", "/v1/completions", {"model": MODEL, "prompt": "shape", "max_tokens": 5}),
    ("tokenize", "/tokenize", {"model": MODEL, "messages": CHAT["messages"]}),
    ("models", "/v1/models", None),
])  # fmt: skip
def test_plain_answers_have_vllms_shape(both: tuple[Proc, VllmServer], name: str, path: str,
                                        body: dict[str, Any] | None) -> None:
    stub, vllm = both
    (stub_status, stub_raw), (vllm_status, vllm_raw) = call(stub.url, path, body), call(vllm.url, path, body)
    assert stub_status == vllm_status == 200
    assert differences(shape(json.loads(stub_raw)), shape(json.loads(vllm_raw)), allowed(name)) == []


@pytest.mark.parametrize(("name", "path", "body"), [
    ("chat", "/v1/chat/completions", CHAT),
    ("chat", "/v1/chat/completions", FORCED),
    ("completion", "/v1/completions", {"model": MODEL, "prompt": "shape", "max_tokens": 5}),
])  # fmt: skip
def test_streams_have_vllms_chunks_in_vllms_order(both: tuple[Proc, VllmServer], name: str, path: str,
                                                  body: dict[str, Any]) -> None:
    stub, vllm = both
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    got = {who: events(call(server.url, path, streamed)[1]) for who, server in (("stub", stub), ("vllm", vllm))}
    for who, chunks in got.items():
        assert chunks[-1] == "[DONE]", who
        assert chunks[-2]["choices"] == [] and chunks[-2]["usage"], who  # the usage chunk, last
        finishes = [c for c in chunks[:-2] if any(ch.get("finish_reason") for ch in c["choices"])]
        assert len(finishes) == 1, who
    stub_shape: dict[str, str] = {}
    vllm_shape: dict[str, str] = {}
    for chunk in got["stub"][:-1]:
        stub_shape.update(shape(chunk))
    for chunk in got["vllm"][:-1]:
        vllm_shape.update(shape(chunk))
    assert differences(stub_shape, vllm_shape, allowed(name)) == []


def test_context_length_refusals_match(both: tuple[Proc, VllmServer]) -> None:
    stub, vllm = both
    long = {**CHAT, "messages": [{"role": "user", "content": " ".join(["word"] * (MAX_MODEL_LEN + 500))}]}
    (stub_status, stub_raw), (vllm_status, vllm_raw) = call(stub.url, "/v1/chat/completions", long), \
        call(vllm.url, "/v1/chat/completions", long)  # fmt: skip
    assert stub_status == vllm_status == 400
    assert differences(shape(json.loads(stub_raw)), shape(json.loads(vllm_raw)), set()) == []
    for raw in (stub_raw, vllm_raw):
        assert f"at least {MAX_MODEL_LEN + 1} input tokens" in json.loads(raw)["error"]["message"]


def test_a_thinking_budget_without_a_reasoning_parser_is_refused_alike(both: tuple[Proc, VllmServer]) -> None:
    stub, vllm = both
    budget = {**CHAT, "thinking_token_budget": 8}
    (stub_status, stub_raw), (vllm_status, vllm_raw) = call(stub.url, "/v1/chat/completions", budget), \
        call(vllm.url, "/v1/chat/completions", budget)  # fmt: skip
    assert stub_status == vllm_status == 400
    assert json.loads(stub_raw)["error"]["message"] == json.loads(vllm_raw)["error"]["message"]
    assert differences(shape(json.loads(stub_raw)), shape(json.loads(vllm_raw)), set()) == []


def test_the_scheduler_gauges_match(both: tuple[Proc, VllmServer]) -> None:
    stub, vllm = both
    family = re.compile(r"^(vllm:num_requests_\w+)(\{[^}]*\})", re.MULTILINE)

    def gauges(url: str) -> set[tuple[str, str]]:
        page = call(url, "/metrics")[1].decode()
        return {(name, re.sub(r'"[^"]*"', '""', labels)) for name, labels in family.findall(page)}

    assert gauges(stub.url) >= gauges(vllm.url)


# -- token ids (`return_token_ids`): the members, where vLLM puts them, with and without ----------
IGNORED = {"system_fingerprint"}  # vLLM's, on its last chunk; nothing reads it


def members(chunks: list[Any]) -> dict[str, set[str]]:
    """The members (nulls included) of each kind of chunk: `first`, `token`, `finish`, `usage`;
    top-level names, and a choice's as `choices[].name`."""
    out: dict[str, set[str]] = {}
    for i, chunk in enumerate(chunks):
        if chunk == "[DONE]":
            continue
        choices = chunk["choices"]
        kind = "usage" if not choices else "first" if i == 0 else "finish" if choices[0]["finish_reason"] else "token"
        out.setdefault(kind, set()).update(chunk.keys() - IGNORED)
        out[kind].update(f"choices[].{name}" for choice in choices for name in choice)
    return out


PROMPT_IDS = [5, 6, 7, 8]
STREAMS = [
    ("/v1/chat/completions", {**CHAT, "return_token_ids": True}),
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 5, "return_token_ids": True}),
    ("/v1/completions", {"model": MODEL, "prompt": "shape", "max_tokens": 5}),
]


@pytest.mark.parametrize(("path", "body"), STREAMS)
def test_stream_chunks_have_vllms_token_id_members(both: tuple[Proc, VllmServer], path: str,
                                                   body: dict[str, Any]) -> None:  # fmt: skip
    stub, vllm = both
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    got = {who: events(call(server.url, path, streamed)[1]) for who, server in (("stub", stub), ("vllm", vllm))}
    assert members(got["stub"]) == members(got["vllm"])
    for who, chunks in got.items():  # and their values: the prompt's ids once, then every token's
        first, rest, usage = chunks[0], chunks[1:-2], chunks[-2]["usage"]
        wanted = body.get("return_token_ids", False)
        prompt = first.get("prompt_token_ids") or first["choices"][0].get("prompt_token_ids")
        assert (prompt is not None) == wanted, who
        if not wanted:
            assert all(c["choices"][0]["token_ids"] is None for c in rest), who
            continue
        assert len(prompt) == usage["prompt_tokens"], who
        if path == "/v1/completions":
            assert prompt == PROMPT_IDS and all(c["choices"][0]["prompt_token_ids"] is None for c in rest), who
        ids = [i for c in chunks[:-2] for i in c["choices"][0].get("token_ids") or []]
        assert len(ids) == usage["completion_tokens"], who


def test_a_streamed_echo_carries_the_prompts_ids_unasked(both: tuple[Proc, VllmServer]) -> None:
    body = {"model": MODEL, "prompt": "shape of it", "max_tokens": 3, "echo": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    for who, server in zip(("stub", "vllm"), both, strict=True):
        chunks = events(call(server.url, "/v1/completions", body)[1])
        assert len(chunks[0]["choices"][0]["prompt_token_ids"]) == chunks[-2]["usage"]["prompt_tokens"], who
        assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:-2]), who


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {**CHAT, "return_token_ids": True}),
    ("/v1/completions", {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 5, "return_token_ids": True}),
])  # fmt: skip
def test_bodies_carry_the_ids_where_vllm_puts_them(both: tuple[Proc, VllmServer], path: str,
                                                   body: dict[str, Any]) -> None:  # fmt: skip
    for who, server in zip(("stub", "vllm"), both, strict=True):
        for asked in (True, False):
            answer = json.loads(call(server.url, path, {**body, "return_token_ids": asked})[1])
            choice, usage = answer["choices"][0], answer["usage"]
            prompt = answer["prompt_token_ids"] if path == "/v1/chat/completions" else choice["prompt_token_ids"]
            if not asked:  # the members are there, null
                assert prompt is None and "token_ids" in choice and choice["token_ids"] is None, who
                continue
            assert len(prompt) == usage["prompt_tokens"] and len(choice["token_ids"]) == usage["completion_tokens"], who
            if path == "/v1/completions":
                assert prompt == PROMPT_IDS, who


def test_a_token_prompt_continues_a_chat_answer_on_both(both: tuple[Proc, VllmServer]) -> None:
    """What a gateway resuming a broken stream sends: the chat's prompt ids and the ids generated
    so far as a completion prompt; both continue with the ids the chat went on with (greedy)."""
    for who, server in zip(("stub", "vllm"), both, strict=True):
        chat = json.loads(call(server.url, "/v1/chat/completions",
                               {**CHAT, "max_tokens": 6, "temperature": 0, "return_token_ids": True})[1])  # fmt: skip
        ids = chat["choices"][0]["token_ids"]
        assert len(ids) == 6, who
        rest = json.loads(call(server.url, "/v1/completions", {
            "model": MODEL, "prompt": chat["prompt_token_ids"] + ids[:2], "max_tokens": 4, "temperature": 0,
            "return_token_ids": True})[1])  # fmt: skip
        assert rest["choices"][0]["token_ids"] == ids[2:], who
        assert rest["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"] + 2, who


@pytest.fixture(scope="module")
def both_reasoning(tmp_path_factory: pytest.TempPathFactory, vllm_fleet: Fleet) -> Iterator[tuple[Proc, VllmServer]]:
    procs = Processes(tmp_path_factory.mktemp("stub-vs-vllm-reasoning"))
    try:
        yield procs.stub("--models", REASONING_MODEL, "--reasoning"), vllm_fleet["reasoning"]
    finally:
        procs.stop_all()


def test_the_end_of_thinking_comes_as_an_empty_delta_with_its_id(both_reasoning: tuple[Proc, VllmServer]) -> None:
    body = {"model": REASONING_MODEL, "messages": CHAT["messages"], "max_tokens": 6, "thinking_token_budget": 2,
            "stream": True}  # fmt: skip
    for who, server in zip(("stub", "vllm"), both_reasoning, strict=True):
        with_ids = [c["choices"][0] for c in events(call(server.url, "/v1/chat/completions",
                                                         {**body, "return_token_ids": True})[1])[1:-1]]  # fmt: skip
        last = max(i for i, c in enumerate(with_ids) if "reasoning" in c["delta"])
        end = with_ids[last + 1]
        assert end["delta"] == {} and len(end["token_ids"]) == 1 and end["finish_reason"] is None, who
        assert "content" in with_ids[last + 2]["delta"], who
        plain = [c["choices"][0] for c in events(call(server.url, "/v1/chat/completions", body)[1])[1:-1]]
        assert not any(c["delta"] == {} and c["finish_reason"] is None for c in plain), who  # no chunk for it
