"""The OpenAI-compatible surface (`/v1`): chat completions and the model list."""

from __future__ import annotations

from adapters.inbound.openai.controller import router

__all__ = ["router"]
