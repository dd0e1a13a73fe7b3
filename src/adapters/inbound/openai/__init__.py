"""The OpenAI-compatible surface (`/v1`): chat completions and the model list."""

from __future__ import annotations

from adapters.inbound._shared.dialect import EdgeContext, Route
from adapters.inbound.openai.controller import SURFACE, routes


class OpenAIDialect:
    """What bootstrap registers: the surface label and its routes."""

    __slots__ = ()
    name = SURFACE

    def routes(self, context: EdgeContext) -> list[Route]:
        return routes(context)


dialect = OpenAIDialect()

__all__ = ["dialect"]
