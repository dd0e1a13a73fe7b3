"""Everything a client sizes is bounded, with the documented defaults, on both surfaces.

Each refusal goes through a real gateway to an official SDK as a `BadRequestError` naming the
field (`param` on `/v1`, the dotted path in the message on `/llm`); nothing reaches the upstream.
Just inside each bound passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from tests.contract.bounds.conftest import MODEL, Edge

USER: Any = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/cat.jpg"}}


def openai_refuses(edge: Edge, param: str, **request: Any) -> str:
    before = edge.reached()
    with pytest.raises(openai.BadRequestError) as caught:
        edge.openai().chat.completions.create(**{"model": MODEL, "messages": USER, **request})
    assert caught.value.param == param and caught.value.code == "invalid-request"
    assert edge.reached() == before
    return caught.value.message


def anthropic_refuses(edge: Edge, where: str, **request: Any) -> str:
    before = edge.reached()
    with pytest.raises(anthropic.BadRequestError) as caught:
        edge.anthropic().messages.create(**{"model": MODEL, "max_tokens": 8, "messages": USER, **request})
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert where in caught.value.message
    assert edge.reached() == before
    return caught.value.message


def test_model_names_are_at_most_256_characters(edge: Edge) -> None:
    name = "claude-" + "x" * 249  # an alias the upstream serves, 256 characters
    assert edge.openai().chat.completions.create(model=name, messages=USER).model == name
    assert edge.anthropic().messages.create(model=name, max_tokens=8, messages=USER).model == name
    for long in (name + "x", "claude-" + "x" * 30_000):
        assert "at most 256" in openai_refuses(edge, "model", model=long)
        assert "at most 256" in anthropic_refuses(edge, "model", model=long)
        with pytest.raises(anthropic.BadRequestError):
            edge.anthropic().messages.count_tokens(model=long, messages=USER)


def test_stop_sequences_are_bounded_in_count_and_length(edge: Edge) -> None:
    sixteen = [f"stop-{i}" for i in range(16)]
    assert edge.openai().chat.completions.create(model=MODEL, messages=USER, stop=sixteen).choices
    assert edge.anthropic().messages.create(model=MODEL, max_tokens=8, messages=USER, stop_sequences=sixteen)
    assert "at most 16" in openai_refuses(edge, "stop", stop=[*sixteen, "one more"])
    assert "at most 16" in anthropic_refuses(edge, "stop_sequences", stop_sequences=[*sixteen, "one more"])
    assert "at most 512" in openai_refuses(edge, "stop[1]", stop=["a", "b" * 513])
    assert "at most 512" in openai_refuses(edge, "stop", stop="b" * 513)
    assert "at most 512" in anthropic_refuses(edge, "stop_sequences.1", stop_sequences=["a", "b" * 513])


def openai_tool(name: str, schema: dict[str, Any]) -> Any:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def anthropic_tool(name: str, schema: dict[str, Any]) -> Any:
    return {"name": name, "input_schema": schema}


SMALL = {"type": "object", "properties": {"q": {"type": "string"}}}


def schema_of(size: int) -> dict[str, Any]:
    """An object schema of about `size` bytes of JSON."""
    return {"type": "object", "description": "d" * size}


@pytest.mark.parametrize(("tool", "send"), [
    (openai_tool, lambda edge, tools: edge.openai().chat.completions.create(model=MODEL, messages=USER, tools=tools)),
    (anthropic_tool, lambda edge, tools: edge.anthropic().messages.create(model=MODEL, max_tokens=8, messages=USER,
                                                                        tools=tools)),
], ids=["v1", "llm"])  # fmt: skip
def test_at_most_256_tools_of_at_most_64_kib_of_schema_each_pass(
    edge: Edge, tool: Callable[[str, dict[str, Any]], Any], send: Callable[[Edge, Any], Any]
) -> None:
    before = edge.reached()
    assert send(edge, [tool(f"t{i}", SMALL) for i in range(256)])
    assert send(edge, [tool("a", SMALL), tool("big", schema_of(65_000))])
    assert edge.reached() == before + 2


def test_more_tools_or_larger_schemas_are_refused(edge: Edge) -> None:
    many = 257
    assert "257 tools" in openai_refuses(edge, "tools", tools=[openai_tool(f"t{i}", SMALL) for i in range(many)])
    assert "257 tools" in anthropic_refuses(edge, "tools", tools=[anthropic_tool(f"t{i}", SMALL) for i in range(many)])
    big = schema_of(66_000)
    tools = [openai_tool("a", SMALL), openai_tool("b", big)]
    assert "at most 65536 bytes" in openai_refuses(edge, "tools[1].function.parameters", tools=tools)
    tools = [anthropic_tool("a", SMALL), anthropic_tool("b", big)]
    assert "at most 65536 bytes" in anthropic_refuses(edge, "tools.1.input_schema", tools=tools)


def test_content_blocks_are_bounded_inside_a_tool_result_too(edge: Edge) -> None:
    """The issue's finding: 2,000 image blocks inside one tool_result passed, 600 top-level ones did not."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}

    def turns(blocks: int) -> Any:
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [IMAGE] * blocks}
        return [*USER, {"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]

    assert edge.anthropic().messages.create(model=MODEL, max_tokens=8, messages=turns(512)).content
    message = anthropic_refuses(edge, "messages.2.content.0.content", messages=turns(2000))
    assert "2000 content blocks" in message and "at most 512" in message
    with pytest.raises(anthropic.BadRequestError) as caught:
        edge.anthropic().messages.count_tokens(model=MODEL, messages=turns(513))
    assert "messages.2.content.0.content" in caught.value.message
    assert "messages.0.content" in anthropic_refuses(edge, "messages.0.content",
                                                     messages=[{"role": "user", "content": [IMAGE] * 600}])
