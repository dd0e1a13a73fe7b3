"""Reasoning and the prefix cache against the real vLLM.

- Thinking on `/llm`: a vLLM without `--reasoning-parser` refuses any thinking budget; the gateway
  (`reasoning = "auto"`, the default) answers anyway, without thinking blocks. A vLLM with
  `--reasoning-parser deepseek_r1` cuts the thinking at the budget: thinking blocks, then text.
- Prompt tokens served from vLLM's prefix cache reach the client: `/v1` `cached_tokens`, `/llm`
  `cache_read_input_tokens` with `input_tokens` the uncached rest."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from tests.contract.vllm.conftest import vllm_toml
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.real_vllm import MAX_NUM_SEQS, MODEL, REASONING_MODEL, Fleet

ASK: Any = [{"role": "user", "content": "Think first, then answer."}]
THINKING: Any = {"type": "enabled", "budget_tokens": 8}
SYSTEM = " ".join(f"rule {i}: answer in the tone of a {w} report." for i, w in enumerate(["weather", "price"] * 60))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, vllm_fleet: Fleet) -> Iterator[Proc]:
    procs = Processes(tmp_path_factory.mktemp("vllm-reasoning"))
    admission = {"sequence_slots": MAX_NUM_SEQS, "max_in_flight": 3, "queue_depth": 8, "queue_timeout_seconds": 60}
    thinking = upstream_toml("thinking", vllm_fleet["reasoning"].url, [REASONING_MODEL], admission,
                             extra='reasoning = true\n')  # fmt: skip
    try:
        yield procs.gateway(vllm_toml(vllm_fleet["main"]) + thinking)
    finally:
        procs.stop_all()


@pytest.fixture
def claude(gateway: Proc) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0, timeout=60)


def test_thinking_against_a_vllm_without_a_reasoning_parser_is_answered(claude: anthropic.Anthropic,
                                                                        gateway: Proc) -> None:
    plain = claude.messages.create(model=MODEL, max_tokens=16, messages=ASK, thinking=THINKING)
    with claude.messages.stream(model=MODEL, max_tokens=16, messages=ASK, thinking=THINKING) as stream:
        streamed = stream.get_final_message()
    for answer in (plain, streamed):
        assert answer.stop_reason == "max_tokens" and answer.usage.output_tokens == 16
        assert [block.type for block in answer.content] == ["text"]
    assert '"thinking_budget_dropped":true' in gateway.text().replace(" ", "")


def test_thinking_against_a_vllm_with_a_reasoning_parser_is_cut_at_the_budget(claude: anthropic.Anthropic) -> None:
    plain = claude.messages.create(model=REASONING_MODEL, max_tokens=24, messages=ASK, thinking=THINKING)
    with claude.messages.stream(model=REASONING_MODEL, max_tokens=24, messages=ASK, thinking=THINKING) as stream:
        kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
        streamed = stream.get_final_message()
    for answer in (plain, streamed):
        assert [block.type for block in answer.content] == ["thinking", "text"]
        assert answer.content[0].type == "thinking" and answer.content[0].thinking
        assert answer.usage.output_tokens == 24
    assert kinds.index("text_delta") > kinds.index("thinking_delta")  # the thinking streamed first


def test_cached_prompt_tokens_reach_both_surfaces(gateway: Proc) -> None:
    def conversation(question: str) -> Any:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]

    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as oai:
        first = oai.chat.completions.create(model=MODEL, max_tokens=4, messages=conversation("v1 first?"))
        again = oai.chat.completions.create(model=MODEL, max_tokens=4, messages=conversation("v1 again?"))
    assert first.usage is not None and again.usage is not None
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert 0 < details.cached_tokens < again.usage.prompt_tokens  # the shared system prompt's blocks
    claude = anthropic.Anthropic(base_url=f"{gateway.url}/llm", api_key="x", max_retries=0)
    one = claude.messages.create(model=MODEL, max_tokens=4, system=SYSTEM, messages=[{"role": "user", "content": "a?"}])
    two = claude.messages.create(model=MODEL, max_tokens=4, system=SYSTEM, messages=[{"role": "user", "content": "b?"}])
    read = two.usage.cache_read_input_tokens
    assert read is not None and read > 0
    assert two.usage.input_tokens + read == one.usage.input_tokens + (one.usage.cache_read_input_tokens or 0)
