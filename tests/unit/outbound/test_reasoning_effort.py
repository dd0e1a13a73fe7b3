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


def test_no_effort_sends_none_and_a_client_extra_still_passes() -> None:
    plain = msgspec.json.decode(encode_chat(ChatRequest(model="m", messages=USER)))
    assert "reasoning_effort" not in plain
    extra = ChatRequest(model="m", messages=USER, extras={"reasoning_effort": "medium"})
    assert msgspec.json.decode(encode_chat(extra))["reasoning_effort"] == "medium"
    both = ChatRequest(model="m", messages=USER, extras={"reasoning_effort": "medium"},
                       reasoning=ReasoningConfig(effort="high"))
    assert msgspec.json.decode(encode_chat(both))["reasoning_effort"] == "high"  # canonical wins
