"""`TooManySequences` (k sequences above what the upstream can ever grant) is a 400 in every
surface's own error shape: the `/v1` problem document with its OpenAI `error` member (chat,
text completions, embeddings, `/v1/responses`), the Anthropic error on `/llm`."""

from __future__ import annotations

import msgspec

from adapters.inbound.anthropic.errors import AnthropicErrors
from adapters.inbound.openai.errors import ProblemRenderer
from adapters.inbound.responses.errors import ResponsesErrors
from domain.errors import TooManySequences

ERROR = TooManySequences(sequences=8, limit=6)


def test_v1_and_responses_render_a_problem_400_with_an_openai_error() -> None:
    for errors in (ProblemRenderer(), ResponsesErrors()):
        status, body, content_type, _ = errors.render(ERROR, "rid")
        problem = msgspec.json.decode(body)
        assert (status, content_type) == (400, b"application/problem+json")
        assert problem["status"] == 400 and problem["type"].endswith("too_many_sequences")
        assert problem["error"]["type"] == "invalid_request_error" and "8 sequence slots" in problem["error"]["message"]


def test_llm_renders_an_anthropic_invalid_request_error() -> None:
    status, body, _, _ = AnthropicErrors().render(ERROR, "rid")
    error = msgspec.json.decode(body)
    assert status == 400 and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error" and "more than the 6" in error["error"]["message"]
