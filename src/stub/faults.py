"""Fault injection for the stub upstream (`--fault KIND`, `--fault-rate P`).

Each kind imitates a way a vLLM server (or the network in front of it) fails:

- ``reset-before-headers``: the connection is reset (TCP RST) without an answer.
- ``reset-mid-stream``: part of the answer (stream: the first frames; non-stream: the
  headers and part of the body), then a reset.
- ``stall-before-headers``: no answer at all until the client leaves.
- ``stall-mid-stream``: part of the answer, then nothing until the client leaves.
- ``malformed-sse``: stream: a ``data:`` frame that is not JSON among good frames;
  non-stream: a 200 whose body is not JSON.
- ``http-4xx``: 400 in vLLM's nested error shape (a context-length overflow).
- ``http-5xx``: 500 in vLLM's error shape (like ``--error-rate``).
- ``http-5xx-html``: 502 with an ingress's HTML page (nginx's version, an internal pod
  address), as a proxy in front of vLLM answers when the pod behind it is gone.
- ``truncated``: stream: the body ends cleanly but without the finish chunk and without
  ``[DONE]``; non-stream: a complete JSON answer whose choice has no finish_reason.
- ``die-mid-stream``: a replica killed while generating (SIGKILL, a lost node). A stream sends
  its head and its first ``--fault-after-tokens`` N token chunks (default 4; reasoning tokens
  count, paced by ``--chunk-delay``), then the connection is reset: no finish chunk, no
  ``[DONE]``, no end of the chunked body; a stream with no more than N tokens to send ends
  before the replica dies (whole). Non-stream: a reset before any answer. The only kind
  that also strikes text completions (``/v1/completions``), as a stream resumed on another
  replica may meet it again.

``random`` picks one kind per faulty request (chat requests only). Which requests are faulty:
the picker sees each chat request (and, under ``die-mid-stream``, each text completion) in
arrival order; ``--fault-after N`` lets the first N of them through (a replica that goes bad),
then each one is faulty with probability ``--fault-rate`` (default 1) until ``--fault-limit M``
faults were injected (default: no limit), and from then on every request is fine (a replica
that recovers, or was replaced). So ``--fault-limit 1``: the first request fails, the next ones
are fine; ``--fault-after 1``: the first is fine, the next ones fail. The draws use the stub's
seeded RNG, so a given ``--seed`` and request order give the same faults. Stalls are bounded by
``STALL_LIMIT`` seconds (then the connection is reset). Everything here is off the fast
path: a stub without ``--fault`` never reaches this module per request.
"""

from __future__ import annotations

import asyncio
import random

import msgspec

from stub.connection import CHUNKED_END, HttpProtocol, chunked, response
from stub.schema import error_body

KINDS = (
    "reset-before-headers",
    "reset-mid-stream",
    "stall-before-headers",
    "stall-mid-stream",
    "malformed-sse",
    "http-4xx",
    "http-5xx",
    "http-5xx-html",
    "truncated",
    "die-mid-stream",
)
RANDOM = "random"
DIE_MID_STREAM = "die-mid-stream"
DEFAULT_AFTER_TOKENS = 4  # die-mid-stream: token chunks sent before the reset
HTTP_FAULTS = ("http-4xx", "http-5xx", "http-5xx-html")
STALL_LIMIT = 300.0  # a stalled answer gives up (reset) after this long at the latest
GAP = 0.05  # after a partial answer, before the reset: the client reads what it got first
GARBAGE_FRAME = b'data: {"id": "chatcmpl-broken", "choices": [{"delta": {"content": "\n\n'
GARBAGE_BODY = b'{"id": "chatcmpl-broken", "object": "chat.completion", "choices": [{"index": 0,'
# What an ingress answers for a pod it cannot reach: nothing of it may reach a gateway client.
PROXY_PAGE = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n"
    b"<p>upstream reasoning-predictor-00001.llm-serving.svc.cluster.local (10.42.7.13:8012) "
    b"connection refused</p>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
)
CONTEXT_MESSAGE = (
    "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
    "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
)


class FaultPicker:
    """Decides, per chat request, whether and which fault to inject."""

    __slots__ = ("after", "kind", "left", "rate", "rng")

    def __init__(
        self, kind: str, rate: float, rng: random.Random, after: int = 0, limit: int | None = None
    ) -> None:
        if kind != RANDOM and kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        self.kind, self.rate, self.rng = kind, rate, rng
        self.after = after  # healthy requests left before the faults begin (`--fault-after`)
        self.left = limit  # faults left to inject (`--fault-limit`); None: no limit

    def draw(self) -> str | None:
        if self.after:
            self.after -= 1
            return None
        if self.left == 0 or (self.rate < 1.0 and self.rng.random() >= self.rate):
            return None
        if self.left is not None:
            self.left -= 1
        return self.rng.choice(KINDS) if self.kind == RANDOM else self.kind


def http_fault(kind: str, keep: bool) -> bytes:
    """The full error response of an ``http-4xx`` / ``http-5xx`` / ``http-5xx-html`` fault."""
    if kind == "http-4xx":
        return response(400, error_body(400, CONTEXT_MESSAGE), keep)
    if kind == "http-5xx-html":
        return response(502, PROXY_PAGE, keep, b"text/html")
    return response(500, error_body(500, "Injected failure (stub --fault http-5xx)."), keep)


async def _stall(proto: HttpProtocol) -> None:
    """Send nothing more; the client's hang-up cancels this (bounded by STALL_LIMIT)."""
    await asyncio.sleep(STALL_LIMIT)
    proto.reset()


async def _reset_after_gap(proto: HttpProtocol) -> None:
    await asyncio.sleep(GAP)
    proto.reset()


def _open_frames(frames: list[bytes]) -> int:
    """How many leading frames come before the finish chunk (role, reasoning, content, tools)."""
    for i, frame in enumerate(frames):
        if b'"finish_reason":null' not in frame:
            return i
    return len(frames)


async def _before_headers(proto: HttpProtocol, kind: str, hold: float) -> bool:
    """Hold, then play a fault that strikes before any byte; True if one was played."""
    if hold:
        await asyncio.sleep(hold)
    if kind == "reset-before-headers":
        proto.reset()
        return True
    if kind == "stall-before-headers":
        await _stall(proto)
        return True
    return False


async def stream_fault(
    proto: HttpProtocol, kind: str, head: bytes, frames: list[bytes], keep: bool, hold: float
) -> None:
    """Play a fault on a streamed answer (``head`` is the status line and headers)."""
    if await _before_headers(proto, kind, hold):
        return
    opened = _open_frames(frames)
    some = max(1, opened // 2)  # the role chunk and about half the content: the 200 is out
    if kind == "truncated":
        proto.finish(head + chunked(frames[:opened]) + CHUNKED_END, keep)
        return
    if kind == "malformed-sse":
        proto.finish(head + chunked([*frames[:some], GARBAGE_FRAME, *frames[some:]]) + CHUNKED_END, keep)
        return
    proto.write(head + chunked(frames[:some]))
    await (_stall(proto) if kind == "stall-mid-stream" else _reset_after_gap(proto))


async def die_mid_stream(
    proto: HttpProtocol, head: bytes, opening: list[bytes], tokens: list[bytes], hold: float, delay: float
) -> None:
    """``die-mid-stream`` on a stream: the head, `opening` and the `tokens` frames (the first N of
    the answer, paced by `delay` as a healthy answer is), then a reset (``proto.reset``: no
    finish chunk, no ``[DONE]``, no chunked terminator)."""
    if hold:
        await asyncio.sleep(hold)
    proto.write(head + chunked(opening + tokens[:1]))
    for frame in tokens[1:]:
        if delay:
            await asyncio.sleep(delay)
            await proto.drain()
        proto.write(chunked([frame]))
    await _reset_after_gap(proto)


async def die_before_answer(proto: HttpProtocol, hold: float) -> None:
    """``die-mid-stream`` on a non-streamed request: the replica dies while generating, so the
    connection is reset before any byte of an answer."""
    if hold:
        await asyncio.sleep(hold)
    proto.reset()


async def answer_fault(proto: HttpProtocol, kind: str, payload: bytes, keep: bool, hold: float) -> None:
    """Play a fault on a non-streamed answer (``payload`` is the full 200 response)."""
    if await _before_headers(proto, kind, hold):
        return
    head, _, body = payload.partition(b"\r\n\r\n")
    if kind == "malformed-sse":
        proto.finish(response(200, GARBAGE_BODY, keep), keep)
        return
    if kind == "truncated":
        doc = msgspec.json.decode(body)
        for choice in doc.get("choices", ()):
            choice["finish_reason"] = None
        proto.finish(response(200, msgspec.json.encode(doc), keep), keep)
        return
    proto.write(head + b"\r\n\r\n" + body[: len(body) // 2])  # Content-Length promises the whole
    await (_stall(proto) if kind == "stall-mid-stream" else _reset_after_gap(proto))
