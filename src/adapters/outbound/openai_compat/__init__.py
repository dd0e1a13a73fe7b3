"""Outbound adapter for OpenAI-compatible model servers (vLLM): aiohttp client (one
session per upstream address), request body mapping, SSE decoding and stream mapping to
canonical events."""

from .client import OpenAICompatClient
from .session import upstream_session

__all__ = ["OpenAICompatClient", "upstream_session"]
