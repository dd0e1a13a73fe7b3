"""vLLM's context-length 400s, in every wording it has used, -> `ContextLengthExceeded`."""

from __future__ import annotations

import pytest

from adapters.outbound.openai_compat.context_errors import parse_context_length, upstream_rejection, with_prompt_count
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


# --- lower bounds: vLLM stops counting a prompt past the limit --------------------------------

VLLM_032 = (
    "This model's maximum context length is 2048 tokens. However, you requested 64 output tokens and your prompt "
    "contains at least 2049 input tokens, for a total of at least 2113 tokens. Please reduce the length of the "
    "input prompt or the number of requested output tokens. (parameter=input_tokens, value=2049)"
)


def _parsed(message: str) -> ContextLengthExceeded:
    error = parse_context_length(message)
    assert error is not None
    return error


@pytest.mark.parametrize(("message", "prompt", "output", "limit"), KNOWN)
def test_only_an_at_least_count_or_the_limit_plus_one_is_a_lower_bound(
    message: str, prompt: int, output: int | None, limit: int
) -> None:
    bound = ("at least" in message and "input tokens" in message) or prompt == limit + 1
    assert _parsed(message).exact is not bound


def test_vllm_032s_refusal_is_a_lower_bound_on_the_prompt_alone() -> None:
    error = _parsed(VLLM_032)
    assert (error.prompt_tokens, error.max_tokens, error.limit, error.exact) == (2049, 64, 2048, False)
    assert error.prompt_alone_too_long


def test_the_engines_own_at_least_one_output_token_is_not_a_bound_on_the_prompt() -> None:
    error = _parsed(
        "The decoder prompt (length 2048) plus the number of requested output tokens (at least 1) is longer than "
        "the maximum model length of 2048. Make sure that `max_model_len` is no smaller than the number of text "
        "tokens (prompt + requested output tokens)."
    )
    assert (error.prompt_tokens, error.limit, error.exact) == (2048, 2048, True)


def test_a_count_replaces_the_bound_and_its_words() -> None:
    bound = _parsed(VLLM_032)
    counted = with_prompt_count(bound, 3672)
    assert (counted.prompt_tokens, counted.max_tokens, counted.limit, counted.exact) == (3672, 64, 2048, True)
    assert counted.message == (
        "This model's maximum context length is 2048 tokens. However, you requested 64 output tokens and your "
        "prompt contains 3672 input tokens, for a total of 3736 tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens."
    )
    assert (counted.status, counted.kind) == (400, "context-length-exceeded")
    again = _parsed(counted.message)  # the new words say the same numbers
    assert (again.prompt_tokens, again.max_tokens, again.limit, again.exact) == (3672, 64, 2048, True)


def test_an_older_bound_with_a_large_output_becomes_prompt_plus_output() -> None:
    """vLLM 0.11 counted to limit - max_tokens + 1: the real prompt may fit alone."""
    counted = with_prompt_count(_parsed(KNOWN[5].values[0]), 800)  # type: ignore[arg-type]
    assert (counted.prompt_tokens, counted.max_tokens, counted.exact) == (800, 32000, True)
    assert not counted.prompt_alone_too_long


def test_a_bound_without_an_output_size_is_worded_as_the_input_alone() -> None:
    bound = _parsed("This model's maximum context length is 4096 tokens. However, your request has 4097 input tokens.")
    assert not bound.exact and bound.max_tokens is None
    counted = with_prompt_count(bound, 5000)
    assert counted.message == ("This model's maximum context length is 4096 tokens. However, your request has 5000 "
                               "input tokens. Please reduce the length of the input messages.")  # fmt: skip
    assert _parsed(counted.message).prompt_tokens == 5000


def test_a_count_below_the_bound_is_not_believed() -> None:
    bound = _parsed(VLLM_032)
    assert with_prompt_count(bound, 12) is bound
