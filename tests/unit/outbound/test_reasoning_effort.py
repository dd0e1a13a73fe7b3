"""`ReasoningConfig.effort` reaches vLLM as `reasoning_effort`, at one of the three levels it takes."""

from __future__ import annotations

import msgspec
import pytest

from adapters.outbound.openai_compat.request_body import encode_chat
from domain.canonical import ChatRequest, Message, ReasoningConfig, TextPart

USER = [Message(role="user", content=[TextPart(text="hi")])]


@pytest.mark.parametrize(("effort", "sent"), [("minimal", "low"), ("low", "low"), ("medium", "medium"),
                                              ("high", "high"), ("xhigh", "high")])
def test_effort_levels(effort: str, sent: str) -> None:
    request = ChatRequest(model="m", messages=USER, reasoning=ReasoningConfig(effort=effort))  # type: ignore[arg-type]
    body = msgspec.json.decode(encode_chat(request))
    assert body["reasoning_effort"] == sent and "chat_template_kwargs" not in body


def test_no_effort_sends_none() -> None:
    plain = msgspec.json.decode(encode_chat(ChatRequest(model="m", messages=USER)))
    assert "reasoning_effort" not in plain
