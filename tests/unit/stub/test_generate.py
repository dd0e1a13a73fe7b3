"""The stub's text completions and embeddings: deterministic, vLLM-shaped answers."""

from __future__ import annotations

import math

import msgspec
import pytest

from stub.completions import COMPLETION_DECODER, CompletionRequest, complete, prompts_of, render
from stub.generate import vector
from stub.schema import token_ids


def request(**fields: object) -> CompletionRequest:
    return COMPLETION_DECODER.decode(msgspec.json.encode({"model": "m", "prompt": "x", **fields}))


def texts(req: CompletionRequest, tokens: int, reasoning: bool = False) -> tuple[list[str], str, str | None]:
    """The pieces, finish_reason and stop_reason of the answer to the request's one prompt."""
    (prompt,) = prompts_of(req)
    answer = complete(req, prompt, tokens, reasoning)
    return [piece for _, piece in answer.tokens], answer.finish, answer.stop_reason


def test_text_fill_in_the_middle_stop_and_max_tokens() -> None:
    assert texts(request(), 4) == (["alpha", " bravo", " charlie", " delta"], "stop", None)
    assert texts(request(max_tokens=2), 4) == (["alpha", " bravo"], "length", None)
    assert texts(request(suffix="y"), 3)[0] == ["papa", " oscar", " november"]
    assert texts(request(stop=["charlie"]), 4) == (["alpha", " bravo", " "], "stop", "charlie")
    assert len(texts(request(), 40)[0]) == 16  # vLLM's default max_tokens
    assert texts(request(), 4, reasoning=True)[0][0] == "alpha"  # a text prompt: no reasoning


def test_prompts_come_as_text_texts_ids_or_lists_of_ids() -> None:
    assert [p.ids for p in prompts_of(request(prompt="a b"))] == [token_ids(["a b"])]
    assert [p.text for p in prompts_of(request(prompt=["a", "b c"]))] == ["a", "b c"]
    assert [p.ids for p in prompts_of(request(prompt=[5, 6, 7]))] == [[5, 6, 7]]
    assert [p.ids for p in prompts_of(request(prompt=[[5, 6], [7]]))] == [[5, 6], [7]]
    for bad in ([], [5, "a"], [[5], 6], [[]], [-1]):
        with pytest.raises(ValueError):
            prompts_of(request(prompt=bad))


def test_token_prompt_members_of_a_body_and_of_a_stream() -> None:
    req = request(prompt=[5, 6], max_tokens=2, return_token_ids=True)
    prompts = prompts_of(req)
    answers = [complete(req, p, 4, False) for p in prompts]
    body = msgspec.json.decode(render(req, prompts, answers, "cmpl-1", 7, False).body or b"")
    choice = body["choices"][0]
    assert (choice["text"], choice["token_ids"]) == ("alpha bravo", [100000, 100001])
    assert choice["prompt_token_ids"] == [5, 6]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    streamed = request(prompt=[5, 6], max_tokens=2, return_token_ids=True, stream=True)
    wire = render(streamed, prompts, answers, "cmpl-1", 7, False)
    chunks = [msgspec.json.decode(f[6:]) for step in wire.steps for f in step] + [
        msgspec.json.decode(f[6:]) for f in wire.closing[:-1]]  # fmt: skip
    assert [c["choices"][0]["prompt_token_ids"] for c in chunks] == [[5, 6], None, None]
    assert [c["choices"][0]["token_ids"] for c in chunks] == [[100000], [100001], []]
    plain = request(prompt="a b", stream=True)
    wire = render(plain, prompts_of(plain), [complete(plain, prompts_of(plain)[0], 1, False)], "cmpl-2", 7, False)
    first = msgspec.json.decode(wire.steps[0][0][6:])
    assert first.keys() == {"id", "object", "created", "model", "choices"}  # no usage member: vLLM has none
    assert first["choices"][0] == {"index": 0, "text": "alpha", "logprobs": None, "finish_reason": None,
                                   "stop_reason": None, "prompt_token_ids": None, "token_ids": None}  # fmt: skip


def test_vectors_are_unit_length_deterministic_and_nested() -> None:
    a, b = vector("the cat", 64), vector("the cat", 64)
    assert a == b and a != vector("the dog", 64)
    assert math.isclose(math.fsum(x * x for x in a), 1.0, rel_tol=1e-4)
    short = vector("the cat", 8)
    norm = math.sqrt(math.fsum(x * x for x in a[:8]))
    assert all(math.isclose(s, x / norm, abs_tol=1e-5) for s, x in zip(short, a[:8], strict=True))
