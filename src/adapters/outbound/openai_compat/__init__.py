"""Outbound adapter for OpenAI-compatible model servers (vLLM): aiohttp client,
request body mapping, SSE decoding and stream mapping to canonical events."""

from .client import AiohttpUpstreamClient

__all__ = ["AiohttpUpstreamClient"]
