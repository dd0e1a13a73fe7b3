"""Failures on `/v1/responses`: the `/v1` problem documents (`_shared/problem.py`).

A refusal before the stream starts (full queue, limits, keys, context length) is the
same problem+json document with the OpenAI `error` member, status and headers as on
`/v1/chat/completions`. After the stream started the stream machine ends it
(`error`, then `response.failed`, numbered in sequence); `stream_error` is only the
bare `error` event, for a caller without the machine.
"""

from __future__ import annotations

from adapters.inbound._shared.problem import DEFAULT_PROBLEM_BASE, error_info, render_problem
from adapters.inbound._shared.sse import event_frame
from adapters.inbound.responses import objects as o
from domain.errors import GatewayError


class ResponsesErrors:
    """The `/v1/responses` `ErrorRenderer`; `base`: of its problems' `type` URIs (`[server]
    problem_base_url`)."""

    __slots__ = ("base",)

    def __init__(self, base: str = DEFAULT_PROBLEM_BASE) -> None:
        self.base = base

    def render(self, error: GatewayError, request_id: str) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        return render_problem(error, request_id, self.base)

    def stream_error(self, error: GatewayError, request_id: str) -> bytes:
        info = error_info(error)
        event = o.ErrorEvent(sequence_number=0, code=info.code or error.kind, message=error.message, param=info.param)
        return event_frame(b"error", o.encode(event))
