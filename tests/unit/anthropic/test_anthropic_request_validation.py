"""Anthropic request validation: every rejection names the field with Anthropic's dotted path."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from adapters.inbound.anthropic.mapping import decode_messages
from domain.errors import InvalidRequest

WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
USER_TURN = {"role": "user", "content": "hi"}


def rejected(**fields: Any) -> InvalidRequest:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(InvalidRequest) as caught:
        decode_messages(msgspec.json.encode(body), "rid")
    assert caught.value.status == 400
    return caught.value


def user(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def assistant(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": list(blocks)}]


def image(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


# fmt: off
CASES: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"model": None}, "model"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}, {"role": "assistant", "content": "x"}]}, "messages.1.role"),
    ({"messages": [{"role": "system", "content": [image({"type": "url", "url": "u"})]}, USER_TURN]},
     "messages.0.content.0.type"),
    ({"messages": [USER_TURN, {"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages.1.content.0.type"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"messages": user({"type": "text", "text": "a"}, {"type": "document"})}, "messages.0.content.1.type"),
    ({"messages": user({"text": "a"})}, "messages.0.content.0.type"),
    ({"messages": user(image({"type": "file", "file_id": "f"}))}, "messages.0.content.0.source.type"),
    ({"messages": user(image({"type": "base64", "media_type": "image/bmp", "data": ""}))},
     "messages.0.content.0.source.media_type"),
    ({"messages": user({"type": "tool_use", "id": "t", "name": "f", "input": {}})},
     "messages.0.content.0.type"),
    ({"messages": assistant({"type": "tool_use", "id": "t", "name": "f", "input": [1]})},
     "messages.1.content.0.input"),
    ({"messages": assistant({"type": "tool_use", "name": "f", "input": {}})}, "messages.1.content.0.id"),
    ({"messages": assistant({"type": "tool_result", "tool_use_id": "t"})}, "messages.1.content.0.type"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]})},
     "messages.0.content.0.content.0.type"),
    ({"messages": user({"type": "thinking", "thinking": "x"})}, "messages.0.content.0.type"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [WEATHER, {"name": "x"}]}, "tools.1.input_schema"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "any"}}, "tool_choice.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"system": [image({"type": "url", "url": "u"})]}, "system.0.type"),
]
# fmt: on


@pytest.mark.parametrize(("fields", "path"), CASES)
def test_validation_errors_name_the_path(fields: dict[str, Any], path: str) -> None:
    error = rejected(**fields)
    assert error.param == path
    assert error.message.startswith(f"{path}: ")


def test_unknown_block_type_message_names_the_type() -> None:
    error = rejected(messages=user({"type": "search_result"}))
    assert error.message == "messages.0.content.0.type: Unsupported type 'search_result'"


def test_missing_field_message() -> None:
    with pytest.raises(InvalidRequest, match=r"^max_tokens: Field required$"):
        decode_messages(b'{"model":"m","messages":[{"role":"user","content":"x"}]}', "r")
    error = rejected(messages=assistant({"type": "tool_use", "name": "f", "input": {}}))
    assert error.message == "messages.1.content.0.id: Field required"


def test_server_tool_error_says_why() -> None:
    assert "not supported" in rejected(tools=[{"type": "bash_20250124", "name": "bash"}]).message


@pytest.mark.parametrize("body", [b"", b"{", b"not json", b'{"model": "m",}'])
def test_malformed_json(body: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        decode_messages(body, "r")


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRequest, match="Expected `object`"):
        decode_messages(b"[1]", "r")
