"""Resuming a broken answer on another replica, exactly, from the token where it broke.

A model server that returns token ids (vLLM's `return_token_ids`) lets the gateway keep a
`TokenTrail` of an answer: the prompt's ids and the ids generated so far. When the replica
dies mid-answer, the prompt's ids plus the generated ids the client has seen the text of are
sent to another replica as a token-id prompt; it continues from the next token, so at
temperature 0 the client gets the text an unbroken answer would have had (docs/resume.md).

Only ids whose text reached the client are sent again (`vouched`): a token whose text the
server held back (an incomplete UTF-8 sequence, the end-of-thinking marker its reasoning parser
swallowed) is generated again by the continuation, which then writes its text.

What cannot be resumed (`not_resumable`) is decided before the call, on the request alone, so
the gateway asks for token ids only where it can use them; a break inside a tool call is the
one reason known only at the break.
"""

from __future__ import annotations

from typing import Final

from domain.canonical import ChatRequest, ToolChoice
from domain.completions import CompletionRequest
from domain.sampling import Sampling

RESUMED: Final = "resumed"
NOT_RESUMABLE: Final = "not_resumable"
FAILED: Final = "failed"
OUTCOMES: Final = (RESUMED, NOT_RESUMABLE, FAILED)
"""`gateway_stream_resumes_total{outcome}`: resumed on another replica; broken but not
resumable (the request's kind, no token ids, no resumes left); the resume itself failed."""

REASONING_END: Final = "</think>"
"""Where a reasoning model's thinking ends in raw text (DeepSeek-R1's and Qwen3's marker, the
one vLLM's `deepseek_r1` and `qwen3` reasoning parsers look for): a continuation is a text
completion, which no reasoning parser splits, so the gateway splits it here."""


class TokenTrail:
    """The token ids of one answer so far, filled by the upstream adapter as chunks arrive.

    `prompt`: the prompt's ids (the server's first chunk), None until known. `generated`: every
    id generated, in order. `vouched`: how many of `generated` the client has the text of: the
    ids up to the last chunk that produced text (or a tool call's part). `reasoning`: the
    vouched text ends inside the thinking. `tool_open`: a tool call was begun and not finished.
    `broken`: set (to the error's text) when the stream broke in a way another replica can
    mend (the connection, a timeout, a 5xx mid-stream), by the adapter that saw it.
    `budgeted`: the request has a thinking budget, which only the server that began the
    thinking counts: the answer can be resumed once its thinking is over, not inside it.
    """

    __slots__ = ("broken", "budgeted", "generated", "prompt", "reasoning", "resumes", "tool_open", "vouched")

    def __init__(self, budgeted: bool = False) -> None:
        self.budgeted = budgeted
        self.prompt: list[int] | None = None
        self.generated: list[int] = []
        self.vouched = 0
        self.reasoning = False
        self.tool_open = False
        self.broken: str | None = None
        self.resumes = 0  # continuations opened so far

    def note(self, ids: list[int] | None, text: bool, reasoning: bool = False) -> None:
        """One chunk of choice 0: its ids, whether it produced text (and whether that text was
        thinking)."""
        if ids:
            self.generated.extend(ids)
        if text:
            self.vouched = len(self.generated)
            self.reasoning = reasoning

    def continuation_prompt(self) -> list[int]:
        """The ids a continuation is sent: the prompt's and the vouched generated ones."""
        assert self.prompt is not None
        return self.prompt + self.generated[: self.vouched]

    def resumable_now(self) -> bool:
        """Whether what arrived allows a continuation: the prompt's ids are known (the server
        returns ids), no tool call is half-written, and a budgeted thinking is over."""
        if self.prompt is None or self.tool_open:
            return False
        return not self.budgeted or (self.vouched > 0 and not self.reasoning)

    def restart(self) -> None:
        """A continuation opens: its ids follow the vouched ones (the rest are generated again)."""
        del self.generated[self.vouched :]
        self.broken = None
        self.resumes += 1


COMPLETION_MAX_TOKENS: Final = 16
"""A text completion's `max_tokens` when the client sets none: OpenAI's and vLLM's default."""
UNBOUNDED: Final = 2**31 - 1
"""A chat answer's when the client sets none: the model's room, which vLLM cuts any limit to."""


def remaining_tokens(request: ChatRequest | CompletionRequest, trail: TokenTrail) -> int:
    """A continuation's `max_tokens` (it is a text completion, whose default is 16): what the
    client allowed, less what it has already got; a chat answer without a limit stays without."""
    limit = request.max_tokens
    if limit is None:
        if isinstance(request, ChatRequest):
            return UNBOUNDED
        limit = COMPLETION_MAX_TOKENS
    return limit - trail.vouched


def not_resumable(request: ChatRequest | CompletionRequest) -> str | None:
    """Why a request's answer could not be continued on another replica, or None if it could.

    The continuation is a text completion of the same model with the same sampling; what it
    cannot reproduce makes a request not resumable: several sequences (`n`, `best_of`), a
    constrained answer (structured outputs: the grammar's state is not carried over), logprobs
    (the continuation's are of another shape), stop strings (the server holds back text that may
    begin one, so the text the client has is not the text of the ids), tools offered (a text
    completion runs no tool parser), a suffix or echo (text completions of another kind). A
    thinking budget limits resumes to after the thinking (`TokenTrail.budgeted`).
    """
    if request.n != 1 or (request.best_of is not None and request.best_of > 1):
        return "several sequences"
    if _constrained(request.sampling):
        return "structured output"
    if request.logprobs:
        return "logprobs"
    if request.stop:
        return "stop strings"
    if isinstance(request, ChatRequest):
        if request.tools and not _no_tools(request.tool_choice):
            return "tools"
        if request.top_logprobs:
            return "logprobs"
    elif request.suffix is not None or request.echo or len(request.prompt) != 1:
        return "suffix, echo or several prompts"
    return None


def _constrained(sampling: Sampling) -> bool:
    return (sampling.response_format is not None and sampling.response_format.get("type", "text") != "text") or any(
        value is not None for value in (sampling.structured_outputs, sampling.guided_json, sampling.guided_choice,
                                        sampling.guided_regex)
    )  # fmt: skip


def _no_tools(choice: ToolChoice | None) -> bool:
    return choice is not None and choice.mode == "none"
