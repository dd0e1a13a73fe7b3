"""How an upstream answer ends: vLLM's `finish_reason` (and `stop_reason`) -> a canonical
`Finish`, or the `StreamError` an answer that failed ends with.

Shared by the chat and the text-completion mappings, plain answers and streams alike.
"""

from __future__ import annotations

from domain.canonical import Finish, StreamError
from domain.errors import GatewayError, UpstreamError


def map_finish(finish_reason: str, stop_reason: str | int | None, tool_calls: bool) -> Finish | StreamError:
    """OpenAI/vLLM finish_reason (+ vLLM stop_reason) -> canonical finish.

    `length` stays `max_tokens` even after tool calls: a truncated call's arguments
    are not valid JSON, and `tool_use` would make the client run it.
    """
    if finish_reason == "length":
        return Finish(reason="max_tokens")
    if finish_reason in ("abort", "error"):
        return StreamError(
            kind=UpstreamError.kind,
            message=f"upstream ended the generation with finish_reason '{finish_reason}'",
            status=UpstreamError.status,
        )
    if finish_reason == "content_filter":
        return Finish(reason="content_filter")
    if tool_calls or finish_reason in ("tool_calls", "function_call"):
        return Finish(reason="tool_use")
    if isinstance(stop_reason, str):  # a stop string matched (an int is a stop token)
        return Finish(reason="stop_sequence", stop_sequence=stop_reason)
    return Finish(reason="end_turn")  # stop, repetition, anything unknown


def error_event(error: GatewayError) -> StreamError:
    return StreamError(kind=error.kind, message=error.message, status=error.status)
