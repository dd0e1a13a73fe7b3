"""The Anthropic Messages surface (`/llm`): messages, count_tokens and the model list."""

from __future__ import annotations

from adapters.inbound.anthropic.controller import router

__all__ = ["router"]
