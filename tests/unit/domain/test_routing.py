"""Model routing: exact names first, then alias patterns; a name never goes to two upstreams."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

import pytest

from domain.errors import AmbiguousModel, ModelNotFound
from domain.name_patterns import common_name
from domain.routing import ModelRouter, Route, find_alias_clash

MODELS = {"reasoning": ["reasoning", "reasoning-v2"], "qwen": ["qwen2.5:3b-instruct"]}
ALIASES = {"reasoning": ["claude-sonnet-*", "claude-opus-*"], "qwen": ["claude-haiku-*"]}


def test_exact_names_route_to_themselves() -> None:
    router = ModelRouter(MODELS, ALIASES)
    assert router.resolve("reasoning-v2") == Route("reasoning", "reasoning-v2")
    assert router.upstream_for("qwen2.5:3b-instruct") == "qwen"


def test_an_alias_calls_the_upstreams_first_model() -> None:
    router = ModelRouter(MODELS, ALIASES)
    assert router.resolve("claude-sonnet-4-6") == Route("reasoning", "reasoning")
    assert router.resolve("claude-haiku-4-5-20251001") == Route("qwen", "qwen2.5:3b-instruct")


@pytest.mark.parametrize("name", ["Claude-sonnet-4", "claude-sonnet", "gpt-4o", ""])
def test_unmatched_names_are_not_found(name: str) -> None:
    with pytest.raises(ModelNotFound):
        ModelRouter(MODELS, ALIASES).resolve(name)  # case-sensitive, and `*` needs the dash before it


def test_the_model_list_has_exact_names_only() -> None:
    assert ModelRouter(MODELS, ALIASES).models() == ["reasoning", "reasoning-v2", "qwen2.5:3b-instruct"]


def test_an_exact_name_wins_over_its_own_upstreams_pattern() -> None:
    router = ModelRouter({"a": ["claude-sonnet-x"]}, {"a": ["claude-*"]})
    assert router.resolve("claude-sonnet-x") == Route("a", "claude-sonnet-x")
    assert router.resolve("claude-opus") == Route("a", "claude-sonnet-x")


@pytest.mark.parametrize(
    ("aliases", "example"),
    [
        ({"a": ["claude-*"], "b": ["claude-*"]}, "claude-"),  # identical patterns
        ({"a": ["claude-*"], "b": ["*-sonnet"]}, "claude-sonnet"),
        ({"a": ["claude-?-x"], "b": ["claude-[0-9]-*"]}, None),
        ({"a": ["claude-sonnet-*"], "b": ["claude-*-4"]}, None),
    ],
)
def test_patterns_of_two_upstreams_that_can_match_one_name_clash(
    aliases: dict[str, list[str]], example: str | None
) -> None:
    clash = find_alias_clash({"a": ["ma"], "b": ["mb"]}, aliases)
    assert clash is not None and (clash.upstream, clash.other, clash.exact) == ("a", "b", False)
    assert fnmatchcase(clash.example, clash.pattern) and fnmatchcase(clash.example, clash.other_name)
    if example is not None:
        assert clash.example == example
    with pytest.raises(ValueError, match="'a' and 'b'"):
        ModelRouter({"a": ["ma"], "b": ["mb"]}, aliases)


def test_a_pattern_matching_another_upstreams_exact_name_clashes() -> None:
    clash = find_alias_clash({"a": ["ma"], "b": ["claude-sonnet-4"]}, {"a": ["claude-sonnet-*"]})
    assert clash is not None
    assert (clash.upstream, clash.pattern, clash.other, clash.other_name, clash.exact) == (
        "a", "claude-sonnet-*", "b", "claude-sonnet-4", True,
    )


@pytest.mark.parametrize(
    "aliases",
    [
        {"a": ["claude-sonnet-*"], "b": ["claude-opus-*"]},
        {"a": ["claude-[a-m]*"], "b": ["claude-[!a-m]*"]},
        {"a": ["x?"], "b": ["x??"]},
        {"a": ["*-a"], "b": ["*-b"]},
    ],
)
def test_disjoint_patterns_do_not_clash(aliases: dict[str, list[str]]) -> None:
    assert find_alias_clash({"a": ["ma"], "b": ["mb"]}, aliases) is None


def test_overlap_is_exact_against_fnmatch() -> None:
    """Every pair of small patterns: a reported name matches both; none reported means none of
    the short names over the patterns' alphabet does (a brute-force cross-check)."""
    alphabet = ["a", "b", "*", "?", "[ab]", "[!a]", "[b-c]"]
    patterns = [x + y for x in alphabet for y in alphabet]
    names = [""] + [x + y + z for x in "abc" for y in ["", *"abc"] for z in ["", *"abc"]]
    for p in patterns:
        for q in patterns:
            found = common_name(p, q)
            if found is None:
                assert not any(fnmatchcase(n, p) and fnmatchcase(n, q) for n in names), (p, q)
            else:
                assert fnmatchcase(found, p) and fnmatchcase(found, q), (p, q, found)


def test_a_name_two_upstreams_claim_is_refused_not_guessed() -> None:
    # `common_name` reads `[` classes as fnmatch does; should a pair ever slip past it,
    # the request is refused with both names rather than sent to either upstream.
    router = ModelRouter({"a": ["ma"], "b": ["mb"]}, {"a": ["x-*"]})
    router._patterns.append((re.compile("x-.*"), "b"))  # simulate the slip
    with pytest.raises(AmbiguousModel, match="'a' and 'b'"):
        router.resolve("x-1")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("reasoning-v2", 8), ("claude-opus-4", 8), ("qwen2.5:3b-instruct", None), ("claude-haiku-4", None),
     ("gpt-4o", None)],
)
def test_a_per_model_setting_is_its_upstreams(name: str, expected: int | None) -> None:
    """`get` (read per request) answers what `[]` and `in` answer: an exact name or an alias
    finds its upstream's value; an upstream without one, or an unknown name, has none."""
    per_model = ModelRouter(MODELS, ALIASES).per_model({"reasoning": 8})
    assert per_model.get(name) == expected
    assert per_model.get(name, -1) == (-1 if expected is None else expected)
    assert (name in per_model) == (expected is not None)
    if expected is not None:
        assert per_model[name] == expected
    else:
        with pytest.raises(KeyError):
            per_model[name]
