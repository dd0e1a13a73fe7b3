"""vLLM's context-length 400s, in every wording it has used, -> `ContextLengthExceeded`."""

from __future__ import annotations

import pytest

from adapters.outbound.openai_compat.context_errors import parse_context_length, upstream_rejection
from domain.errors import ContextLengthExceeded, UpstreamRejected

# (upstream message, prompt tokens, requested output, limit), one per wording vLLM has used
KNOWN = [
    pytest.param(
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
        "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        8000, 1000, 8192, id="0.4-prompt-and-completion",
    ),
    pytest.param(
        "This model's maximum context length is 4096 tokens. However, you requested 4097 tokens in the "
        "messages, Please reduce the length of the messages.",
        4097, None, 4096, id="0.4-messages-only",
    ),
    pytest.param(
        "This model's maximum context length is 4096 tokens. However, your request has 4176 input tokens. "
        "Please reduce the length of the input messages.",
        4176, None, 4096, id="0.8-request-has-input-tokens",
    ),
    pytest.param(
        "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is "
        "4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None",
        2778, 8000, 4096, id="0.9-max-tokens-too-large",
    ),
    pytest.param(
        "'max_tokens' is too large: 500. This model's maximum context length is 1024 tokens and your request "
        "has 600 input tokens (500 > 1024 - 600).",
        600, 500, 1024, id="max-tokens-too-large-short",
    ),
    pytest.param(
        "This model's maximum context length is 32768 tokens. However, you requested 32000 output tokens and "
        "your prompt contains at least 769 input tokens, for a total of at least 32769 tokens. Please reduce "
        "the length of the input prompt or the number of requested output tokens. "
        "(parameter=input_tokens, value=769)",
        769, 32000, 32768, id="0.11-output-and-at-least-input",
    ),
    pytest.param(
        "This model's maximum context length is 262144 tokens. However, you requested 0 output tokens and "
        "your prompt contains at least 262145 input tokens, for a total of at least 262145 tokens.",
        262145, 0, 262144, id="0.11-prompt-alone",
    ),
    pytest.param(
        "The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that "
        "`max_model_len` is no smaller than the number of text tokens plus multimodal tokens.",
        9000, None, 8192, id="v1-engine-decoder-prompt",
    ),
]


@pytest.mark.parametrize(("message", "prompt", "output", "limit"), KNOWN)
def test_each_known_wording_gives_its_numbers(message: str, prompt: int, output: int | None, limit: int) -> None:
    error = upstream_rejection(400, message)
    assert isinstance(error, ContextLengthExceeded)
    assert (error.prompt_tokens, error.max_tokens, error.limit) == (prompt, output, limit)
    assert (error.status, error.kind, error.message) == (400, "context-length-exceeded", message)


def test_the_prompt_alone_or_prompt_plus_output() -> None:
    def parsed(message: str) -> ContextLengthExceeded:
        error = parse_context_length(message)
        assert error is not None
        return error

    assert parsed("maximum context length is 100 tokens. your request has 100 input tokens").prompt_alone_too_long
    assert parsed("maximum context length is 100 tokens. 150 in the messages").prompt_alone_too_long
    both = parsed("maximum context length is 100 tokens; you requested 120 tokens (90 in the messages, 30 in the "
                  "completion)")
    assert not both.prompt_alone_too_long


@pytest.mark.parametrize(
    "message",
    [
        "Invalid value for `temperature`: 3.",
        "[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]",
        "This model's maximum context length is 8192 tokens.",  # no prompt size: nothing to act on
        "This model's maximum context length is 8192 tokens. Your request has 10 input tokens.",  # fits: odd
        "your request has 9000 input tokens",  # no limit
    ],
)
def test_other_400s_pass_through_unchanged(message: str) -> None:
    error = upstream_rejection(400, message)
    assert type(error) is UpstreamRejected
    assert (error.status, error.kind, error.message) == (400, "upstream-rejected", message)


def test_only_a_400_is_read_as_a_context_length_refusal() -> None:
    message = KNOWN[0].values[0]
    assert isinstance(message, str)
    error = upstream_rejection(422, message)
    assert type(error) is UpstreamRejected and error.status == 422
