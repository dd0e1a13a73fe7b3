"""Model name -> upstream key."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from domain.errors import ModelNotFound


class ModelRouter:
    """Routes a model name to the upstream that serves it.

    Built once from configuration; every model name belongs to exactly one upstream.
    """

    __slots__ = ("_by_model",)

    def __init__(self, models_by_upstream: Mapping[str, Iterable[str]]) -> None:
        by_model: dict[str, str] = {}
        for upstream, models in models_by_upstream.items():
            for model in models:
                if model in by_model:
                    raise ValueError(
                        f"model '{model}' is served by both '{by_model[model]}' and '{upstream}'"
                    )
                by_model[model] = upstream
        self._by_model = by_model

    def upstream_for(self, model: str) -> str:
        try:
            return self._by_model[model]
        except KeyError:
            raise ModelNotFound(model) from None

    def models(self) -> list[str]:
        return list(self._by_model)
