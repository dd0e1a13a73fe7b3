"""vLLM's token-id members, cut out of the bytes a client may see.

vLLM 0.32 writes `token_ids` in every choice of a chat stream's token and finish chunks and of
its answers, `prompt_token_ids` in a chat stream's first chunk and answer, and both in every
choice of a text completion's chunks and answers: null unless the request asked for
`return_token_ids`, and an echoed prompt's ids in a completion stream even unasked. They are
not OpenAI's API, and the ids are the gateway's own business: no native payload (an answer's
body, a stream payload, the bytes around a learnt token's text) keeps them.

Where vLLM writes them (in the answer and in its choices) the views of `wire.py` declare them,
so the decode a payload gets anyway counts them, and a payload without any is not searched.
They are cut on the bytes, so every other member stays exactly as the upstream wrote it
(floats, escapes, order). vLLM's own form, a null after another member (`,"token_ids":null`),
is cut by a `replace`; that is exact for valid JSON: inside a string every `"` is escaped, so
a `"` right after a `,` opens a member's name. Any other form (blanks, ids, first in its
object) is cut by the general path, the same reasoning in regular expressions, and failing
that (a value that is neither null nor a list of integers) removed from the decoded document,
the rest re-encoded. Such members deeper in an answer are not counted: vLLM writes none there
(only in `kv_transfer_params` of disaggregated serving, which the gateway never asks for).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec
from msgspec import UNSET

_TOKEN_NULL, _PROMPT_NULL = b',"token_ids":null', b',"prompt_token_ids":null'  # vLLM's usual
_TOKEN_SIZE, _PROMPT_SIZE = len(_TOKEN_NULL), len(_PROMPT_NULL)
# The general path: any blanks, every member whose value is null or a list of integers.
_KEY = b'token_ids"'
_VALUE = rb'(?:null|\[[-0-9,\s]*\])'
_AFTER_COMMA = re.compile(rb',\s*"(?:prompt_)?token_ids"\s*:\s*' + _VALUE)
_FIRST = re.compile(rb'(?<=\{)\s*"(?:prompt_)?token_ids"\s*:\s*' + _VALUE + rb'\s*,?')
_LEFT = re.compile(rb'[,{]\s*"(?:prompt_)?token_ids"\s*:')
_NAMES = frozenset(("token_ids", "prompt_token_ids"))
_ENCODER = msgspec.json.Encoder()


class Members(Protocol):
    """A view that declares the members (UNSET: absent)."""

    token_ids: Any
    prompt_token_ids: Any


class Answer(Members, Protocol):
    """A view of an answer or a stream payload: the members, and its choices'."""

    @property
    def choices(self) -> Sequence[Members]: ...


def without_token_ids(data: bytes, view: Answer) -> bytes:
    """A payload without its token-id members (`view`, its decode, counts them); `data`
    itself when it has none."""
    # `_counts` written out: a call less per payload
    tokens: int = view.token_ids is not UNSET
    prompts: int = view.prompt_token_ids is not UNSET
    for choice in view.choices:
        tokens += choice.token_ids is not UNSET
        prompts += choice.prompt_token_ids is not UNSET
    if not tokens and not prompts:
        return data
    cut = _cut_nulls(data, tokens, prompts)
    return _general(data) if cut is None else cut


def cut_tail(tail: bytes, view: Answer) -> bytes | None:
    """The bytes after a token's text (`token_frames.token_shape`) without the members the
    payload's decode (`view`) counted: `tail` itself when it has none; None unless all are in
    `tail`, null and after another member (the shape is then not used: its payloads take the
    full decode)."""
    tokens, prompts = _counts(view)
    return tail if not tokens and not prompts else _cut_nulls(tail, tokens, prompts)


def _counts(view: Answer) -> tuple[int, int]:
    """How many `token_ids` and `prompt_token_ids` members `view` holds, in the answer and in
    its choices."""
    tokens: int = view.token_ids is not UNSET
    prompts: int = view.prompt_token_ids is not UNSET
    for choice in view.choices:
        tokens += choice.token_ids is not UNSET
        prompts += choice.prompt_token_ids is not UNSET
    return tokens, prompts


def _cut_nulls(data: bytes, tokens: int, prompts: int) -> bytes | None:
    """`data` without every null member after another member (vLLM's form); None if fewer
    than the `tokens` and `prompts` counted were in that form (more: deeper ones too)."""
    if tokens:
        cut = data.replace(_TOKEN_NULL, b"")
        if len(data) - len(cut) < tokens * _TOKEN_SIZE:
            return None
        data = cut
    if prompts:
        cut = data.replace(_PROMPT_NULL, b"")
        if len(data) - len(cut) < prompts * _PROMPT_SIZE:
            return None
        data = cut
    return data


def _general(data: bytes) -> bytes:
    """The members cut in any form, blanks and all; those whose value is neither null nor a
    list of integers removed from the decoded document."""
    if _KEY in data:
        data = _FIRST.sub(b"", _AFTER_COMMA.sub(b"", data))
    if _KEY not in data or _LEFT.search(data) is None:
        return data
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return data  # not JSON: nothing is made up
    return _ENCODER.encode(_dropped(doc))


def _dropped(value: Any) -> Any:
    """A decoded document without the members `_NAMES`, at any depth."""
    if isinstance(value, dict):
        return {key: _dropped(item) for key, item in value.items() if key not in _NAMES}
    if isinstance(value, list):
        return [_dropped(item) for item in value]
    return value
