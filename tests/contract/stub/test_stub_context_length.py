"""The stub's `--max-model-len`, as vLLM 0.32 behaves (a real subprocess, the openai SDK and raw
HTTP): a prompt over the limit is a 400 that counts only to the limit + 1 ("at least"), while
`/tokenize` counts the whole prompt; a prompt of exactly the limit is the engine's refusal; a
prompt that fits with too large a `max_tokens` is answered, its output shortened to fit."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from tests.contract.stub.test_stub_server import post, post_chat, sdk

from stub.launcher import running_stub

LIMIT = 2048


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.fixture(scope="module")
def tight() -> Iterator[str]:
    with running_stub("--max-model-len", str(LIMIT), "--tokens", "16") as base:
        yield base


async def test_a_prompt_over_the_limit_is_counted_only_to_the_limit_plus_one(tight: str) -> None:
    messages = [{"role": "user", "content": words(3672)}]
    status, body = await post_chat(tight, messages=messages, max_tokens=64)
    assert status == 400
    assert body["error"] == {
        "message": "This model's maximum context length is 2048 tokens. However, you requested 64 output tokens "
        "and your prompt contains at least 2049 input tokens, for a total of at least 2113 tokens. Please reduce "
        "the length of the input prompt or the number of requested output tokens. "
        "(parameter=input_tokens, value=2049)",
        "type": "BadRequestError", "param": "input_tokens", "code": 400,
    }
    status, counted = await post(tight, "/tokenize", {"model": "m", "messages": messages})
    assert status == 200 and counted["count"] == 3672 and counted["max_model_len"] == LIMIT
    async with sdk(tight) as client:
        with pytest.raises(openai.BadRequestError, match="at least 2049 input tokens"):
            await client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]


async def test_a_prompt_of_exactly_the_limit_leaves_no_room(tight: str) -> None:
    status, body = await post_chat(tight, messages=[{"role": "user", "content": words(LIMIT)}])
    assert status == 400 and body["error"]["param"] is None
    assert body["error"]["message"].startswith(
        "The decoder prompt (length 2048) plus the number of requested output tokens (at least 1) is longer than "
        "the maximum model length of 2048."
    )


async def test_too_large_a_max_tokens_is_shortened_not_refused(tight: str) -> None:
    async with sdk(tight) as client:
        fits = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": words(LIMIT - 5)}], max_tokens=1000
        )
        roomy = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": words(100)}], max_tokens=100_000
        )
    assert fits.choices[0].finish_reason == "length"
    assert fits.usage is not None and (fits.usage.prompt_tokens, fits.usage.completion_tokens) == (LIMIT - 5, 5)
    assert roomy.choices[0].finish_reason == "stop"  # room enough: the stub's whole --tokens answer
    assert roomy.usage is not None and roomy.usage.completion_tokens == 16


async def test_models_report_the_limit(tight: str) -> None:
    async with sdk(tight) as client:
        listed = [m async for m in client.models.list()]
    assert [m.model_extra["max_model_len"] for m in listed if m.model_extra] == [LIMIT]
