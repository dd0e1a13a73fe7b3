"""Model name -> upstream key (and the model name that upstream is called with)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from fnmatch import fnmatchcase, translate
from typing import NamedTuple

from domain.errors import AmbiguousModel, ModelNotFound
from domain.name_patterns import common_name


class Route(NamedTuple):
    upstream: str
    model: str
    """The name the upstream is called with: the client's for an exact name, else the
    upstream's own first model name."""


class AliasClash(NamedTuple):
    """Two upstreams that could both claim one model name."""

    upstream: str
    pattern: str
    other: str
    other_name: str  # the other upstream's pattern, or its exact model name
    exact: bool  # `other_name` is an exact model name
    example: str  # a name both match


def find_alias_clash(
    models_by_upstream: Mapping[str, Iterable[str]], aliases_by_upstream: Mapping[str, Iterable[str]]
) -> AliasClash | None:
    """The first pair of upstreams whose aliases can match one name, or None.

    The rule: an alias pattern of one upstream clashes with an exact model name of
    another upstream that it matches (exact names win, so the pattern would silently
    not apply), and with a pattern of another upstream when some name matches both
    (decided exactly, see `domain.name_patterns`; identical patterns trivially).
    """
    names = list(aliases_by_upstream)
    for index, upstream in enumerate(names):
        for pattern in aliases_by_upstream[upstream]:
            for other, models in models_by_upstream.items():
                if other == upstream:
                    continue
                for model in models:
                    if fnmatchcase(model, pattern):
                        return AliasClash(upstream, pattern, other, model, True, model)
            for other in names[index + 1:]:
                for other_pattern in aliases_by_upstream[other]:
                    example = common_name(pattern, other_pattern)
                    if example is not None:
                        return AliasClash(upstream, pattern, other, other_pattern, False, example)
    return None


class ModelRouter:
    """Routes a model name to the upstream that serves it.

    Built once from configuration. Exact `models` names of every upstream are looked up
    first; then the `aliases` patterns (fnmatch, case-sensitive). Every exact name
    belongs to exactly one upstream, and no name may match the aliases of two.
    """

    __slots__ = ("_by_model", "_first", "_patterns")

    def __init__(
        self, models_by_upstream: Mapping[str, Iterable[str]],
        aliases_by_upstream: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        by_model: dict[str, str] = {}
        first: dict[str, str] = {}
        for upstream, models in models_by_upstream.items():
            for model in models:
                if model in by_model:
                    raise ValueError(
                        f"model '{model}' is served by both '{by_model[model]}' and '{upstream}'"
                    )
                by_model[model] = upstream
                first.setdefault(upstream, model)
        aliases = {name: list(patterns) for name, patterns in (aliases_by_upstream or {}).items() if patterns}
        clash = find_alias_clash(models_by_upstream, aliases)
        if clash is not None:
            raise ValueError(
                f"aliases of '{clash.upstream}' and '{clash.other}' can both match '{clash.example}'"
            )
        self._by_model = by_model
        self._first = first
        self._patterns = [
            (re.compile(translate(pattern)), upstream)
            for upstream, patterns in aliases.items() if upstream in first
            for pattern in patterns
        ]

    def resolve(self, model: str) -> Route:
        """The route for `model`; raises `ModelNotFound`, or `AmbiguousModel` (never guesses)."""
        upstream = self._by_model.get(model)
        if upstream is not None:
            return Route(upstream, model)
        matched = {upstream for pattern, upstream in self._patterns if pattern.match(model)}
        if not matched:
            raise ModelNotFound(model)
        if len(matched) > 1:  # configuration checks forbid it; should it slip through, refuse
            raise AmbiguousModel(model, sorted(matched))
        (upstream,) = matched
        return Route(upstream, self._first[upstream])

    def upstream_for(self, model: str) -> str:
        return self.resolve(model).upstream

    def models(self) -> list[str]:
        """The exact model names (aliases are patterns, never listed)."""
        return list(self._by_model)

    def per_model(self, values_by_upstream: Mapping[str, int]) -> Mapping[str, int]:
        """A per-upstream setting looked up by model name, aliases included."""
        return _ByModel(self, values_by_upstream)


class _ByModel(Mapping[str, int]):
    __slots__ = ("_router", "_values")

    def __init__(self, router: ModelRouter, values: Mapping[str, int]) -> None:
        self._router = router
        self._values = dict(values)

    def __getitem__(self, model: str) -> int:
        try:
            upstream = self._router.resolve(model).upstream
        except (ModelNotFound, AmbiguousModel):
            raise KeyError(model) from None
        return self._values[upstream]

    def get(self, model: str, default: int | None = None) -> int | None:  # type: ignore[override]
        """`Mapping.get` without its `__getitem__` and `KeyError` round trip: the edge reads two
        of these per request, almost always for an exact model name."""
        upstream = self._router._by_model.get(model)
        if upstream is None:
            try:
                upstream = self._router.resolve(model).upstream
            except (ModelNotFound, AmbiguousModel):
                return default
        return self._values.get(upstream, default)

    def __iter__(self) -> Iterator[str]:
        return (m for m in self._router.models() if self._router.upstream_for(m) in self._values)

    def __len__(self) -> int:
        return sum(1 for _ in self)
