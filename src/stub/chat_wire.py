"""A chat answer on the wire: vLLM's `chat.completion` body and `chat.completion.chunk` frames.

Pure (no I/O): the HTTP layer only moves these bytes. A stream's frames are built from one
byte template per answer, and the JSON of each answer word is cached: the stub is the
upstream of every benchmark.

Token ids (``stub.tokens``) are placed as vLLM 0.32 places them, with ``return_token_ids`` as
lists and without it as the nulls vLLM writes: a stream's role chunk has the top-level
``prompt_token_ids`` (and ``prompt_text: null``), every later choice ``token_ids``; a body has
the top-level ``prompt_token_ids`` and each choice's ``token_ids`` (the whole answer's).
"""

from __future__ import annotations

from typing import Any

from stub.answers import Answer
from stub.schema import encode
from stub.tokens import CONTENT_BASE, REASONING_BASE, THINK_END, TOOL_BASE


def _usage(answer: Answer, n: int = 1) -> dict[str, Any]:
    p, c = answer.prompt_tokens, answer.completion_tokens * n
    usage: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if answer.cached_tokens is not None:  # as vLLM with --enable-prompt-tokens-details
        usage["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens}
    return usage


def answer_ids(answer: Answer) -> list[int]:
    """The token ids of a whole answer, in order: reasoning, end of thinking, content or call."""
    ids = [REASONING_BASE + j for j in range(len(answer.reasoning))]
    if answer.think_end:
        ids.append(THINK_END)
    ids += [CONTENT_BASE + i for i in range(len(answer.content))]
    return ids + [TOOL_BASE + k for k in range(len(answer.fragments))]


def completion_body(
    answer: Answer, rid: str, created: int, model: str, call_id: str, n: int = 1, return_ids: bool = False
) -> bytes:
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
        "token_ids": answer_ids(answer) if return_ids else None,
    }
    return encode(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{**choice, "index": i} for i in range(n)],
            "usage": _usage(answer, n),
            "prompt_token_ids": list(answer.prompt_ids) if return_ids else None,
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
_OPEN_TAIL = b',"logprobs":null,"finish_reason":null'
_NULL_TAIL = _OPEN_TAIL + b',"token_ids":null}]}\n\n'


def stream_frames(
    answer: Answer, rid: str, created: int, model: str, call_id: str, include_usage: bool, n: int = 1,
    return_ids: bool = False,
) -> list[bytes]:
    """SSE frames (``data: {chunk}\\n\\n``) of a streamed answer, in order."""
    opening, tokens, closing = stream_parts(answer, rid, created, model, call_id, include_usage, n, return_ids)
    return [*opening, *tokens, *closing]


def stream_parts(
    answer: Answer, rid: str, created: int, model: str, call_id: str, include_usage: bool, n: int = 1,
    return_ids: bool = False,
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """A streamed answer's SSE frames, built from one template, in three parts.

    (the role chunk), (one frame per generated token: reasoning, content, tool call
    pieces), (the finish chunk, the usage chunk if asked, ``[DONE]``). vLLM writes a
    frame per engine step, so only the token frames are paced (``--chunk-delay``); the
    frames after the last token leave with it. With `n` choices every frame is sent once
    per choice index, in index order. With `return_ids` each token frame carries its
    token's id (the end of thinking gets a frame of its own, delta ``{}``, as from vLLM's
    reasoning parser; the frame opening a tool call and the finish frame carry ``[]``).
    """
    top = b'{"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s' % (
        rid.encode(),
        created,
        encode(model),
    )
    head = b"data: " + top + b',"choices":[{"index":0,"delta":'

    def tail(token: int | None) -> bytes:  # the end of a token frame: its ids
        if not return_ids:
            return _NULL_TAIL
        return _OPEN_TAIL + (b',"token_ids":[]}]}\n\n' if token is None else b',"token_ids":[%d]}]}\n\n' % token)

    prompt_ids = encode(list(answer.prompt_ids)) if return_ids else b"null"
    opening = [head + b'{"role":"assistant","content":""}' + _OPEN_TAIL + b'}],"prompt_token_ids":' + prompt_ids
               + b',"prompt_text":null}\n\n']  # fmt: skip
    frames = [head + b'{"reasoning":' + _enc(p) + b"}" + tail(REASONING_BASE + j)
              for j, p in enumerate(answer.reasoning)]  # fmt: skip
    if return_ids and answer.think_end:  # vLLM sends the end of thinking only when it reports ids
        frames.append(head + b"{}" + tail(THINK_END))
    frames += [head + b'{"content":' + _enc(p) + b"}" + tail(CONTENT_BASE + i) for i, p in enumerate(answer.content)]
    if answer.tool is not None:
        start = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": answer.tool, "arguments": ""},
        }
        frames.append(head + b'{"tool_calls":' + encode([start]) + b"}" + tail(None))
        for k, fragment in enumerate(answer.fragments):
            delta = b'{"tool_calls":[{"index":0,"function":{"arguments":%s}}]}' % _enc(fragment)
            frames.append(head + delta + tail(TOOL_BASE + k))
    closing = [
        head
        + b'{},"logprobs":null,"finish_reason":"%s","stop_reason":%s,"token_ids":%s}]}\n\n'
        % (answer.finish_reason.encode(), encode(answer.stop_reason), b"[]" if return_ids else b"null")
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
