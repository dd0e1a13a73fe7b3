"""Domain failures in the `/v1` shape: RFC 9457 problem documents (`_shared/problem.py`).

Each document also carries OpenAI's `error` member, because openai-python reads
`body["error"]` for `.message`, `.type` and `.code`; without it the SDK shows only
"Error code: 503". Mid-stream failures use the frame vLLM sends, which the SDK
raises as `APIError`.
"""

from __future__ import annotations

from adapters.inbound._shared.problem import DEFAULT_PROBLEM_BASE, error_type, render_problem
from adapters.inbound.openai import schema as w
from domain.errors import GatewayError

DONE = b"data: [DONE]\n\n"


def stream_error_frame(kind: str, message: str, status: int) -> bytes:
    """`data: {"error": ...}` then `[DONE]`: the terminal frames of a failed stream."""
    info = w.ErrorInfo(message=message, type=error_type(status), code=kind)
    return b"data: " + w.encode(w.StreamErrorFrame(error=info)) + b"\n\n" + DONE


class ProblemRenderer:
    """The `/v1` `ErrorRenderer` of chat completions, text completions and embeddings; `base`:
    of its problems' `type` URIs (`[server] problem_base_url`)."""

    __slots__ = ("base",)

    def __init__(self, base: str = DEFAULT_PROBLEM_BASE) -> None:
        self.base = base

    def render(
        self, error: GatewayError, request_id: str
    ) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        return render_problem(error, request_id, self.base)

    def stream_error(self, error: GatewayError, request_id: str) -> bytes:
        return stream_error_frame(error.kind, error.message, error.status)
