"""The stub's token ids (`return_token_ids`) and continuations of token-id prompts (no sockets)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stub.answers import REASONING, build_answer, content_pieces
from stub.chat_wire import answer_ids, completion_body, stream_frames
from stub.schema import CHAT_DECODER, ChatRequest, token_ids
from stub.tokens import CONTENT_BASE, REASONING_BASE, THINK_END, TOOL_BASE, Tail, continuation, generated_tail

TOOL = {"type": "function", "function": {"name": "get", "parameters": {"properties": {"city": {"type": "string"}}}}}
ROLE_CHUNK = {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
# vLLM 0.32's members of a stream choice (`exclude_unset`): the role chunk's, a token's, the finish's
ROLE_CHOICE = {"index", "delta", "logprobs", "finish_reason"}
TOKEN_CHOICE = {"index", "delta", "logprobs", "finish_reason", "token_ids"}
FINISH_CHOICE = {"index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"}


def chat(**fields: object) -> ChatRequest:
    return CHAT_DECODER.decode(msgspec.json.encode({"model": "m", "messages": [], **fields}))


def chunks(frames: list[bytes]) -> list[dict[str, Any]]:
    assert frames[-1] == b"data: [DONE]\n\n"
    return [msgspec.json.decode(f[6:-2]) for f in frames[:-1]]


@pytest.mark.parametrize(("ids", "tail"), [
    ([5, 6], Tail()),
    ([5, 200000, 200001], Tail(reasoning=2)),
    ([5, 200000, THINK_END], Tail(reasoning=1, ended=True)),
    ([5, *range(200000, 200005), THINK_END, 100000, 100001], Tail(reasoning=5, ended=True, content=2)),
    ([THINK_END, 100000], Tail(ended=True, content=1)),
    ([100000, 100001, 100002], Tail(content=3)),
    ([100000, 7], Tail()),  # a word after them: not a tail
])  # fmt: skip
def test_the_generated_tail_of_a_prompt_is_counted_by_kind(ids: list[int], tail: Tail) -> None:
    assert generated_tail(ids) == tail


def test_a_continuation_is_the_rest_of_the_answer_from_the_next_token() -> None:
    whole = continuation(Tail(), 3, reasoning=True)
    assert [t for t, _ in whole] == [*range(200000, 200005), THINK_END, 100000, 100001, 100002]
    assert "".join(text for _, text in whole) == "Let me think about this.</think>alpha bravo charlie"
    for k in range(len(whole) + 1):  # cut anywhere: the tail of those k ids continues with the rest
        assert continuation(generated_tail([5, *(t for t, _ in whole[:k])]), 3, True) == whole[k:]
    assert continuation(Tail(content=2), 3, reasoning=False) == [(100002, " charlie")]
    assert continuation(Tail(reasoning=2), 1, reasoning=False) == [(100000, "alpha")]  # no reasoning to continue


@pytest.mark.parametrize("reasoning", [False, True])
def test_chat_stream_ids_are_placed_as_vllm_places_them(reasoning: bool) -> None:
    answer = build_answer(chat(messages=[{"role": "user", "content": "hi there"}]), 3, reasoning)
    got = chunks(stream_frames(answer, "chatcmpl-1", 7, "m", "t", include_usage=True, return_ids=True))
    role, tokens, finish, usage = got[0], got[1:-2], got[-2], got[-1]
    assert role.keys() == ROLE_CHUNK and role["choices"][0].keys() == ROLE_CHOICE
    assert role["prompt_token_ids"] == token_ids(["hi there"]) and role["prompt_text"] is None
    assert all(c.keys() == ROLE_CHUNK - {"prompt_token_ids", "prompt_text"} for c in got[1:-1])
    assert all(c["choices"][0].keys() == TOKEN_CHOICE for c in tokens)
    assert finish["choices"][0].keys() == FINISH_CHOICE and finish["choices"][0]["token_ids"] == []
    sent = [i for c in tokens for i in c["choices"][0]["token_ids"]]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in tokens)  # one id per piece
    assert sent == answer_ids(answer) and len(sent) == usage["usage"]["completion_tokens"]
    expected = [*range(REASONING_BASE, REASONING_BASE + len(REASONING)), THINK_END] if reasoning else []
    assert sent == [*expected, 100000, 100001, 100002]
    if reasoning:  # the end of thinking: a chunk of its own with an empty delta, as vLLM's parser sends it
        assert [c["choices"][0]["delta"] for c in tokens if c["choices"][0]["token_ids"] == [THINK_END]] == [{}]


def test_without_return_token_ids_the_members_are_there_as_null() -> None:
    answer = build_answer(chat(), 2, reasoning=True)
    got = chunks(stream_frames(answer, "chatcmpl-1", 7, "m", "t", include_usage=False))
    assert got[0].keys() == ROLE_CHUNK and got[0]["prompt_token_ids"] is None
    assert all(c["choices"][0].keys() == TOKEN_CHOICE and c["choices"][0]["token_ids"] is None for c in got[1:-1])
    assert got[-1]["choices"][0].keys() == FINISH_CHOICE and got[-1]["choices"][0]["token_ids"] is None
    assert len(got) == 1 + len(REASONING) + 2 + 1  # no end-of-thinking chunk: vLLM skips its empty delta
    body = msgspec.json.decode(completion_body(answer, "chatcmpl-1", 7, "m", "t"))
    assert body["prompt_token_ids"] is None and body["choices"][0]["token_ids"] is None


def test_chat_body_ids_and_n_choices() -> None:
    answer = build_answer(chat(messages=[{"role": "user", "content": "a b c"}]), 2, reasoning=True)
    body = msgspec.json.decode(completion_body(answer, "chatcmpl-1", 7, "m", "t", n=2, return_ids=True))
    assert body["prompt_token_ids"] == token_ids(["a b c"]) and len(body["prompt_token_ids"]) == 3
    whole = [*range(200000, 200005), THINK_END, 100000, 100001]
    assert [c["token_ids"] for c in body["choices"]] == [whole, whole]
    assert body["usage"]["completion_tokens"] == 2 * len(whole)
    got = chunks(stream_frames(answer, "chatcmpl-1", 7, "m", "t", include_usage=False, n=2, return_ids=True))
    assert [c["prompt_token_ids"] for c in got[:2]] == [[*body["prompt_token_ids"]]] * 2  # each choice's role chunk


def test_a_tool_call_has_ids_too() -> None:
    answer = build_answer(chat(tools=[TOOL], tool_choice="required"), 16, reasoning=False)
    got = chunks(stream_frames(answer, "chatcmpl-1", 7, "m", "t", include_usage=True, return_ids=True))
    ids = [c["choices"][0]["token_ids"] for c in got[1:-2]]
    assert ids[0] == [] and ids[1:] == [[TOOL_BASE + k] for k in range(len(answer.fragments))]
    assert len(ids) - 1 == got[-1]["usage"]["completion_tokens"]
    cut = build_answer(chat(tools=[TOOL], tool_choice="required", max_tokens=1), 16, reasoning=False)
    got = chunks(stream_frames(cut, "chatcmpl-1", 7, "m", "t", include_usage=True, return_ids=True))
    assert [c["choices"][0]["token_ids"] for c in got[1:-2]] == [[], [TOOL_BASE]]  # what usage counts: 1


def test_stopped_content_keeps_the_ids_of_its_pieces() -> None:
    answer = build_answer(chat(stop="avo"), 16, reasoning=False)
    assert answer.content == ("alpha", " br") and answer_ids(answer) == [CONTENT_BASE, CONTENT_BASE + 1]
    assert content_pieces(2) == ("alpha", " bravo")
