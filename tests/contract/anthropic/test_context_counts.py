"""Token counts from the upstream, through a real `gateway serve` and the official SDKs.

- A context-length refusal reports the prompt's real size on every surface that words it,
  though vLLM 0.32 (and the stub with `--max-model-len`) counts a prompt only to the limit
  + 1 ("at least 2049 input tokens"): the gateway asks the same server's `/tokenize`, the
  same replica's with `[endpoints]`. A client that trims by the difference then trims enough.
- A prompt that fits with too large a `max_tokens` is answered (vLLM shortens the output).
- `count_tokens` against llama.cpp's `llama-server`, whose `/tokenize` answers
  `{"tokens": [...]}` and tokenizes only text (`{"content": ...}`): a fake llama-server in
  the test process (no llama-server binary is available to the tests), answering as its
  source does: `/apply-template` for the prompt text, then `/tokenize` of that text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from tests.support.processes import Proc, Processes, free_port, upstream_toml
from tests.support.replicas import endpoints_toml

LIMIT, PROMPT = 2048, 3672  # the stub counts a token per word
LONG = " ".join(f"w{i}" for i in range(PROMPT))
NOWHERE = "http://127.0.0.1:9"  # the replica upstream's identity only: nothing listens there
ADMISSION = {"sequence_slots": 4, "max_in_flight": 3, "queue_depth": 4, "queue_timeout_seconds": 10}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("context-counts"))
    try:
        tight, replica = procs.together(partial(procs.stub, "--max-model-len", str(LIMIT), "--tokens", "16")
                                        for _ in range(2))
        toml = (upstream_toml("tight", tight.url, ["tight"])
                + upstream_toml("replicated", NOWHERE, ["replicated"], ADMISSION)
                + endpoints_toml("replicated", urls=[replica.url]))  # fmt: skip
        yield procs.gateway(toml)
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


@pytest.mark.parametrize("model", ["tight", "replicated"])
@pytest.mark.parametrize("streaming", [False, True])
async def test_anthropic_hears_the_real_prompt_size(claude: anthropic.AsyncAnthropic, streaming: bool,
                                                    model: str) -> None:  # fmt: skip
    messages: Any = [{"role": "user", "content": LONG}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        if streaming:
            async with claude.messages.stream(model=model, max_tokens=64, messages=messages) as stream:
                await stream.get_final_message()
        else:
            await claude.messages.create(model=model, max_tokens=64, messages=messages)
    body: Any = caught.value.body
    assert body["error"] == {"type": "invalid_request_error",
                             "message": "prompt is too long: 3672 tokens > 2048 maximum"}  # fmt: skip


@pytest.mark.parametrize("streaming", [False, True])
def test_openai_chat_hears_the_real_prompt_size(gpt: openai.OpenAI, streaming: bool) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gpt.chat.completions.create(model="tight", messages=[{"role": "user", "content": LONG}], max_tokens=64,
                                    stream=streaming)  # fmt: skip
    error = caught.value
    assert error.status_code == 400 and error.code == "context_length_exceeded" and error.param == "messages"
    problem = error.response.json()
    assert problem["error"]["message"] == problem["detail"] == (
        "This model's maximum context length is 2048 tokens. However, you requested 64 output tokens and your "
        "prompt contains 3672 input tokens, for a total of 3736 tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens."
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_responses_hear_the_real_prompt_size(gpt: openai.OpenAI, streaming: bool) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        answer = gpt.responses.create(model="replicated", input=LONG, max_output_tokens=64, stream=streaming)
        if streaming:
            list(answer)  # type: ignore[arg-type]
    assert caught.value.code == "context_length_exceeded"
    assert "your prompt contains 3672 input tokens" in caught.value.message


async def test_too_large_a_max_tokens_is_answered_shortened(claude: anthropic.AsyncAnthropic) -> None:
    fits = " ".join(f"w{i}" for i in range(LIMIT - 8))
    answer = await claude.messages.create(model="tight", max_tokens=4000, messages=[{"role": "user", "content": fits}])
    assert answer.stop_reason == "max_tokens"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (LIMIT - 8, 8)


# --- count_tokens against llama.cpp's llama-server --------------------------------------------


def _llama_template(messages: list[dict[str, Any]]) -> str:
    """A ChatML-like chat template, as llama-server's `/apply-template` renders one."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


@pytest.fixture
async def llama_server() -> AsyncIterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """A fake llama-server: `/tokenize` tokenizes `content` only (a token per word, plus BOS with
    `add_special`) and answers `{"tokens": [...]}`; `/apply-template` renders the chat template."""
    calls: list[tuple[str, dict[str, Any]]] = []

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        calls.append(("/tokenize", body))
        tokens: list[int] = []
        if "content" in body:
            tokens = [1] * bool(body.get("add_special", False)) + [7] * len(body["content"].split())
        return web.json_response({"tokens": tokens})

    async def apply_template(request: web.Request) -> web.Response:
        body = await request.json()
        calls.append(("/apply-template", body))
        return web.json_response({"prompt": _llama_template(body["messages"])})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/apply-template", apply_template)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", calls
    finally:
        await runner.cleanup()


async def test_count_tokens_against_llama_server(
    procs: Processes, llama_server: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    url, calls = llama_server
    gw = procs.gateway(upstream_toml("llama", url, ["llama"]))
    user: Any = [{"role": "user", "content": "one two three"}]
    async with anthropic.AsyncAnthropic(base_url=f"{gw.url}/llm", api_key="x", max_retries=0, timeout=20) as sdk:
        counted = await sdk.messages.count_tokens(model="llama", messages=user)
    # "<|im_start|>user\none two three<|im_end|>\n<|im_start|>assistant\n": 5 words, and the BOS
    assert counted.input_tokens == 6
    assert [path for path, _ in calls] == ["/tokenize", "/apply-template", "/tokenize"]
    assert calls[2][1] == {"content": _llama_template(user), "add_special": True}
