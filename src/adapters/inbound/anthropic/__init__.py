"""The Anthropic Messages surface (`/llm`): messages, count_tokens and the model list."""

from __future__ import annotations

from adapters.inbound._shared.dialect import EdgeContext, Route
from adapters.inbound.anthropic.controller import routes
from adapters.inbound.anthropic.mapping import SURFACE


class AnthropicDialect:
    """What bootstrap registers: the surface label and its routes."""

    __slots__ = ()
    name = SURFACE

    def routes(self, context: EdgeContext) -> list[Route]:
        return routes(context)


dialect = AnthropicDialect()

__all__ = ["dialect"]
