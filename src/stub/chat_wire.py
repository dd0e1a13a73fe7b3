"""A chat answer on the wire: vLLM's `chat.completion` body and `chat.completion.chunk` frames.

Pure (no I/O): the HTTP layer only moves these bytes. A stream's frames are built from one
byte template per answer, and the JSON of each answer word is cached: the stub is the
upstream of every benchmark.
"""

from __future__ import annotations

from typing import Any

from stub.answers import Answer
from stub.schema import encode
from stub.tools import split_arguments


def _usage(answer: Answer, n: int = 1) -> dict[str, Any]:
    p, c = answer.prompt_tokens, answer.completion_tokens * n
    usage: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if answer.cached_tokens is not None:  # as vLLM with --enable-prompt-tokens-details
        usage["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens}
    return usage


def completion_body(answer: Answer, rid: str, created: int, model: str, call_id: str, n: int = 1) -> bytes:
    """Non-streaming chat.completion JSON; `n` choices (the same answer, indices 0..n-1)."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(answer.content)}
    if answer.reasoning:
        message["reasoning"] = "".join(answer.reasoning)
    if answer.tool is not None:  # vLLM leaves `tool_calls` out of an answer without calls
        message["content"] = None
        function = {"name": answer.tool, "arguments": answer.arguments}
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": answer.finish_reason,
        "stop_reason": answer.stop_reason,
    }
    return encode(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{**choice, "index": i} for i in range(n)],
            "usage": _usage(answer, n),
        }
    )


_PIECES: dict[str, bytes] = {}


def _enc(piece: str) -> bytes:
    """JSON string of a piece, cached: the same words recur in every answer."""
    out = _PIECES.get(piece)
    if out is None:
        out = encode(piece)
        if len(_PIECES) < 4096:
            _PIECES[piece] = out
    return out


DONE_FRAME = b"data: [DONE]\n\n"


def stream_frames(
    answer: Answer, rid: str, created: int, model: str, call_id: str, include_usage: bool, n: int = 1
) -> list[bytes]:
    """SSE frames (``data: {chunk}\\n\\n``) of a streamed answer, in order."""
    opening, tokens, closing = stream_parts(answer, rid, created, model, call_id, include_usage, n)
    return [*opening, *tokens, *closing]


def stream_parts(
    answer: Answer, rid: str, created: int, model: str, call_id: str, include_usage: bool, n: int = 1
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """A streamed answer's SSE frames, built from one template, in three parts.

    (the role chunk), (one frame per generated token: reasoning, content, tool call
    pieces), (the finish chunk, the usage chunk if asked, ``[DONE]``). vLLM writes a
    frame per engine step, so only the token frames are paced (``--chunk-delay``); the
    frames after the last token leave with it. With `n` choices every frame is sent once
    per choice index, in index order.
    """
    top = b'{"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s' % (
        rid.encode(),
        created,
        encode(model),
    )
    head = b"data: " + top + b',"choices":[{"index":0,"delta":'
    tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
    opening = [head + b'{"role":"assistant","content":""}' + tail]
    frames = [head + b'{"reasoning":' + _enc(p) + b"}" + tail for p in answer.reasoning]
    frames += [head + b'{"content":' + _enc(p) + b"}" + tail for p in answer.content]
    if answer.tool is not None:
        start = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": answer.tool, "arguments": ""},
        }
        frames.append(head + b'{"tool_calls":' + encode([start]) + b"}" + tail)
        for fragment in split_arguments(answer.arguments):
            delta = b'{"tool_calls":[{"index":0,"function":{"arguments":%s}}]}' % _enc(fragment)
            frames.append(head + delta + tail)
    closing = [
        head
        + b'{},"logprobs":null,"finish_reason":"%s","stop_reason":%s}]}\n\n'
        % (answer.finish_reason.encode(), encode(answer.stop_reason))
    ]
    if n > 1:
        opening, frames, closing = _per_choice(opening, n), _per_choice(frames, n), _per_choice(closing, n)
    if include_usage:
        closing.append(b"data: " + top + b',"choices":[],"usage":' + encode(_usage(answer, n)) + b"}\n\n")
    closing.append(DONE_FRAME)
    return opening, frames, closing


_CHOICE_0 = b'"choices":[{"index":0,'


def _per_choice(frames: list[bytes], n: int) -> list[bytes]:
    """Each choice-0 frame once per choice index 0..n-1."""
    return [frame.replace(_CHOICE_0, b'"choices":[{"index":%d,' % i, 1) for frame in frames for i in range(n)]
