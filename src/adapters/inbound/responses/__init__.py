"""The OpenAI Responses API (`POST /v1/responses`), a dialect of its own under `/v1`."""

from __future__ import annotations

from adapters.inbound.responses.controller import router

__all__ = ["router"]
