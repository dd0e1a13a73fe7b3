"""A context-length refusal on `/llm`: the Anthropic API's own wording, with the upstream's numbers."""

from __future__ import annotations

import msgspec
import pytest

from adapters.inbound.anthropic.errors import AnthropicErrors
from domain.errors import ContextLengthExceeded, UpstreamRejected

UPSTREAM_TEXT = "This model's maximum context length is 8192 tokens. However, ..."


def rendered(error: UpstreamRejected) -> tuple[int, dict[str, str]]:
    status, body, content_type, _ = AnthropicErrors().render(error, "rid")
    assert content_type == b"application/json"
    return status, msgspec.json.decode(body)["error"]


def frame_data(error: UpstreamRejected) -> dict[str, str]:
    frame = AnthropicErrors().stream_error(error, "rid")
    assert frame.startswith(b"event: error\n")
    return msgspec.json.decode(frame.split(b"data: ", 1)[1])["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("prompt", "output", "limit", "message"),
    [
        (8300, None, 8192, "prompt is too long: 8300 tokens > 8192 maximum"),
        (8300, 1000, 8192, "prompt is too long: 8300 tokens > 8192 maximum"),
        (8192, 0, 8192, "prompt is too long: 8192 tokens > 8192 maximum"),
        (8000, 1000, 8192, "input length and `max_tokens` exceed context limit: 8000 + 1000 > 8192, "
                           "decrease input length or `max_tokens` and try again"),
    ],
)
def test_context_length_in_anthropic_words(prompt: int, output: int | None, limit: int, message: str) -> None:
    error = ContextLengthExceeded(UPSTREAM_TEXT, prompt_tokens=prompt, max_tokens=output, limit=limit)
    assert rendered(error) == (400, {"type": "invalid_request_error", "message": message})
    # after queue frames the 200 is out: the same words in the terminal error event
    assert frame_data(error) == {"type": "invalid_request_error", "message": message}


def test_any_other_upstream_4xx_keeps_its_message() -> None:
    assert rendered(UpstreamRejected(400, "bad temperature")) == (
        400, {"type": "invalid_request_error", "message": "bad temperature"},
    )
