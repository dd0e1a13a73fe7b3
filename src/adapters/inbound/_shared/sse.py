"""Server-sent events framing (no dialect knowledge)."""

from __future__ import annotations


def data_frame(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def event_frame(event: bytes, data: bytes) -> bytes:
    return b"event: " + event + b"\ndata: " + data + b"\n\n"


def comment_frame(text: bytes = b"keep-alive") -> bytes:
    return b": " + text + b"\n\n"
