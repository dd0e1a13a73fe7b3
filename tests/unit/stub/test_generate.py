"""The stub's text completions and embeddings: deterministic, vLLM-shaped answers."""

from __future__ import annotations

import math

from stub.generate import CompletionRequest, _pieces, vector


def test_text_fill_in_the_middle_stop_and_max_tokens() -> None:
    assert _pieces(CompletionRequest(model="m", prompt="x"), 4) == (["alpha", " bravo", " charlie", " delta"],
                                                                     "stop", None)
    assert _pieces(CompletionRequest(model="m", prompt="x", max_tokens=2), 4) == (["alpha", " bravo"], "length", None)
    assert _pieces(CompletionRequest(model="m", prompt="x", suffix="y"), 3)[0] == ["papa", " oscar", " november"]
    assert _pieces(CompletionRequest(model="m", prompt="x", stop=["charlie"]), 4) == (["alpha", " bravo", " "],
                                                                                       "stop", "charlie")
    assert len(_pieces(CompletionRequest(model="m", prompt="x"), 40)[0]) == 16  # vLLM's default max_tokens


def test_vectors_are_unit_length_deterministic_and_nested() -> None:
    a, b = vector("the cat", 64), vector("the cat", 64)
    assert a == b and a != vector("the dog", 64)
    assert math.isclose(math.fsum(x * x for x in a), 1.0, rel_tol=1e-4)
    short = vector("the cat", 8)
    norm = math.sqrt(math.fsum(x * x for x in a[:8]))
    assert all(math.isclose(s, x / norm, abs_tol=1e-5) for s, x in zip(short, a[:8], strict=True))
