"""Outbound adapter for OpenAI-compatible model servers (vLLM): keep-alive HTTP/1.1 client,
request body mapping, SSE decoding and stream mapping to canonical events."""

from .client import OpenAICompatClient

__all__ = ["OpenAICompatClient"]
