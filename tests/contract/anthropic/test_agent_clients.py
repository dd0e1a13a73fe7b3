"""What agent clients do, through a real `gateway serve`, real stubs and the official SDKs.

System turns inside `messages`, model aliases, context-length refusals in each API's own
words, and the client's session id in the access log.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.support.processes import Proc, Processes, upstream_toml

SONNET, HAIKU = "claude-sonnet-4-6", "claude-haiku-4-5-20251001"
CONTEXT_WORDS = (
    "input length and `max_tokens` exceed context limit: 8000 + 1000 > 8192, "
    "decrease input length or `max_tokens` and try again"
)  # the stub's --fault http-4xx: vLLM's "... 9000 tokens (8000 in the messages, 1000 in the completion)"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir = tmp_path_factory.mktemp("agent-clients")
    procs = Processes(workdir)
    try:
        big, small, tight = procs.together([partial(procs.stub, "--tokens", "4", log=workdir / "big.log"),
                                            partial(procs.stub, "--tokens", "4", log=workdir / "small.log"),
                                            partial(procs.stub, "--fault", "http-4xx")])
        toml = (upstream_toml("big", big.url, ["reasoning"], extra='aliases = ["claude-sonnet-*", "claude-opus-*"]\n')
                + upstream_toml("small", small.url, ["qwen2.5:3b-instruct"], extra='aliases = ["claude-haiku-*"]\n')
                + upstream_toml("tight", tight.url, ["tight"]))  # fmt: skip
        proc = procs.gateway(toml)
        proc.extra.update(big=big, small=small)
        yield proc
    finally:
        procs.stop_all()


@pytest.fixture
async def claude(gateway: Proc) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0,
                                        timeout=20) as sdk:  # fmt: skip
        yield sdk


@pytest.fixture
def gpt(gateway: Proc) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as sdk:
        yield sdk


def stub_lines(gateway: Proc, name: str) -> list[str]:
    log = gateway.extra[name].extra["log"]  # type: ignore[attr-defined]
    assert isinstance(log, Path)
    return log.read_text().splitlines()


def field(line: str, name: str) -> Any:
    return json.loads(line.split(f" {name}=", 1)[1].split(" ", 1)[0])


# --- 1. system turns inside messages ------------------------------------------------------

AGENT_TURNS: Any = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "system", "content": [{"type": "text", "text": "Reminder: be brief."}]},
    {"role": "user", "content": "go on"},
    {"role": "system", "content": "Tools are available."},
]


@pytest.mark.parametrize("streaming", [False, True])
async def test_system_turns_inside_messages_reach_the_upstream_in_place(
    gateway: Proc, claude: anthropic.AsyncAnthropic, streaming: bool
) -> None:
    before = len(stub_lines(gateway, "big"))
    if streaming:
        async with claude.messages.stream(model="reasoning", max_tokens=16, system="You are terse.",
                                          messages=AGENT_TURNS) as stream:  # fmt: skip
            message = await stream.get_final_message()
    else:
        message = await claude.messages.create(model="reasoning", max_tokens=16, system="You are terse.",
                                               messages=AGENT_TURNS)  # fmt: skip
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"
    (line,) = stub_lines(gateway, "big")[before:]
    assert field(line, "roles") == ["system", "user", "assistant", "system", "user", "system"]


# --- 2. model aliases -----------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
async def test_an_alias_routes_to_its_upstream_and_is_echoed_on_llm(
    gateway: Proc, claude: anthropic.AsyncAnthropic, streaming: bool
) -> None:
    before = len(stub_lines(gateway, "big"))
    messages: Any = [{"role": "user", "content": "hi"}]
    if streaming:
        async with claude.messages.stream(model=SONNET, max_tokens=16, messages=messages) as stream:
            message = await stream.get_final_message()
    else:
        message = await claude.messages.create(model=SONNET, max_tokens=16, messages=messages)
    assert message.model == SONNET and message.content
    (line,) = stub_lines(gateway, "big")[before:]
    assert field(line, "model") == "reasoning"  # the upstream's own first model name


def test_an_alias_routes_to_its_upstream_and_is_echoed_on_v1(gateway: Proc, gpt: openai.OpenAI) -> None:
    before = len(stub_lines(gateway, "small"))
    messages: Any = [{"role": "user", "content": "hi"}]
    completion = gpt.chat.completions.create(model=HAIKU, messages=messages)
    assert completion.model == HAIKU and completion.choices[0].message.content
    chunks = list(gpt.chat.completions.create(model=HAIKU, messages=messages, stream=True))
    assert chunks and {chunk.model for chunk in chunks} == {HAIKU}
    lines = stub_lines(gateway, "small")[before:]
    assert [field(line, "model") for line in lines] == ["qwen2.5:3b-instruct"] * 2


async def test_model_lists_name_exact_models_only(claude: anthropic.AsyncAnthropic, gpt: openai.OpenAI) -> None:
    exact = {"reasoning", "qwen2.5:3b-instruct", "tight"}
    assert {model.id async for model in claude.models.list()} == exact
    assert {model.id for model in gpt.models.list()} == exact


async def test_a_name_no_alias_matches_is_not_found(claude: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        await claude.messages.create(model="Claude-Sonnet-4-6", max_tokens=8,  # patterns are case-sensitive
                                     messages=[{"role": "user", "content": "x"}])


# --- 3. context-length refusals -------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
async def test_context_length_in_anthropic_words(claude: anthropic.AsyncAnthropic, streaming: bool) -> None:
    messages: Any = [{"role": "user", "content": "a very long prompt"}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        if streaming:
            async with claude.messages.stream(model="tight", max_tokens=1000, messages=messages) as stream:
                await stream.get_final_message()
        else:
            await claude.messages.create(model="tight", max_tokens=1000, messages=messages)
    body: Any = caught.value.body
    assert body["error"] == {"type": "invalid_request_error", "message": CONTEXT_WORDS}


@pytest.mark.parametrize("streaming", [False, True])
def test_context_length_with_openais_code(gpt: openai.OpenAI, streaming: bool) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gpt.chat.completions.create(model="tight", messages=[{"role": "user", "content": "long"}], stream=streaming)
    error = caught.value
    assert error.status_code == 400 and error.code == "context_length_exceeded" and error.param == "messages"
    assert "maximum context length is 8192 tokens" in error.message


# --- 5. client attribution -------------------------------------------------------------------


async def test_the_session_header_is_in_the_access_log(gateway: Proc, claude: anthropic.AsyncAnthropic) -> None:
    session = "5f0c8e9a-agent-session"
    async with claude.messages.stream(model=SONNET, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                      extra_headers={"X-Claude-Code-Session-Id": session}) as stream:  # fmt: skip
        await stream.get_final_message()
    await claude.messages.create(model=SONNET, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                 extra_headers={"X-Claude-Code-Session-Id": "s" * 200})  # fmt: skip
    records = [json.loads(line) for line in gateway.text().splitlines() if line.startswith("{")]
    ours = [r for r in records if r.get("session_id") == session]
    assert len(ours) == 1 and ours[0]["model"] == SONNET and ours[0]["upstream"] == "big" and ours[0]["stream"]
    # a value longer than 128 characters is not recorded; the request itself is served
    assert records[-1]["session_id"] is None and records[-1]["status"] == 200


def test_an_aliased_llm_stream_is_valid_and_names_the_alias(gateway: Proc) -> None:
    body = json.dumps({"model": SONNET, "max_tokens": 8, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    request = urllib.request.Request(f"{gateway.url}/llm/v1/messages", data=body,
                                     headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=20) as response:
        events = check_anthropic_stream(response.read())
    assert events[0].data["message"]["model"] == SONNET
