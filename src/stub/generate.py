"""The stub's text completions (`POST /v1/completions`) and embeddings (`POST /v1/embeddings`).

Shaped like vLLM's answers, deterministic, and counted in flight with the chat requests
(one `--log` line each, `completion start ...` / `embeddings start ...`, with the shared
`in_flight=N max_concurrent=M`), so a test sees them under the same cap. `--hold` and
`--chunk-delay` apply, and `--max-num-seqs` counts their sequences with the chat requests
(each prompt's max(n, best_of), each embedding input); `--error-rate` and `--fault` are for
chat only.

- Completion text: the chat answer's words ("alpha bravo ...", `--tokens` of them, cut by
  `max_tokens`, which defaults to 16 as in vLLM, and by `stop`). With `suffix` (fill in the
  middle) the words run backwards from the end of the alphabet ("papa oscar november ..."):
  vLLM itself refuses `suffix` ("suffix is not currently supported"), servers that fill in the
  middle take it, and a test can tell the two answers apart. `echo` prepends the prompt; `n`
  answers that many choices; `logprobs` adds vLLM's legacy logprobs object.
- Embeddings: one vector per input, derived from SHA-256 of the input (the same input always
  gets the same vector), `dimensions` long (default 32, at most 4096), unit length;
  `encoding_format: "base64"` gives little-endian float32 bytes in base64, as OpenAI does.
- Usage: prompt tokens are the prompt's (or inputs') whitespace-separated words.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import os
import struct
import time
from typing import TYPE_CHECKING, Any

import msgspec

from stub.answers import WORDS, content_pieces
from stub.connection import CHUNKED_END, STREAM_HEAD, chunked, response
from stub.schema import encode, error_body

if TYPE_CHECKING:
    from stub.connection import HttpProtocol
    from stub.state import StubState

PATHS = (b"/v1/completions", b"/v1/embeddings")
DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions
DEFAULT_DIMENSIONS, MAX_DIMENSIONS = 32, 4096


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = True


class CompletionRequest(msgspec.Struct):
    model: str
    prompt: str | list[str]
    suffix: str | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None


class EmbeddingRequest(msgspec.Struct):
    model: str
    input: str | list[str]
    dimensions: int | None = None
    encoding_format: str = "float"


_COMPLETION = msgspec.json.Decoder(CompletionRequest)
_EMBEDDING = msgspec.json.Decoder(EmbeddingRequest)


def handle(stub: StubState, proto: HttpProtocol, path: bytes, body: bytes, keep: bool) -> asyncio.Task[None] | None:
    """Answer one request on one of `PATHS`; a task when it must wait (`--hold`, `--chunk-delay`)."""
    config = stub.config
    try:
        model, stream, kind, data, sequences = _answer(stub, path, body, keep)
    except (msgspec.DecodeError, ValueError) as exc:  # ValidationError is a DecodeError
        proto.finish(response(400, error_body(400, str(exc)), keep), keep)
        return None
    if config.models and model not in config.models:
        proto.finish(response(404, error_body(404, f"The model `{model}` does not exist."), keep), keep)
        return None
    line = f"{kind} start model={encode(model).decode()} stream={'true' if stream else 'false'}"
    paced = stream and config.chunk_delay
    scheduler = stub.scheduler
    if not config.hold and not paced and (scheduler is None or scheduler.free(sequences)):
        _start(stub, proto, line)
        stub.release(proto)
        proto.finish(b"".join(data), keep)
        return None

    async def later() -> None:
        turn = scheduler.enter(sequences) if scheduler is not None else None
        _start(stub, proto, line)
        try:
            if scheduler is None:
                await play()
                return
            if turn is not None:
                await scheduler.wait(turn)  # cancelled: it leaves the queue, holding nothing
            try:
                await play()
            finally:
                scheduler.leave(sequences)
        finally:
            stub.release(proto)

    async def play() -> None:
        if config.hold:
            await asyncio.sleep(config.hold)
        if not paced:
            proto.finish(b"".join(data), keep)
            return
        for piece in data[:-1]:
            proto.write(piece)
            await asyncio.sleep(config.chunk_delay)
            await proto.drain()
        proto.finish(data[-1], keep)

    return asyncio.get_running_loop().create_task(later())


def _answer(stub: StubState, path: bytes, body: bytes, keep: bool) -> tuple[str, bool, str, list[bytes], int]:
    """(model, stream, log kind, the bytes to write in order, sequences); raises ValueError /
    DecodeError (400). Sequences: each embedding input, each prompt's max(n, best_of)."""
    if path == b"/v1/embeddings":
        embeddings = _EMBEDDING.decode(body)
        inputs = 1 if isinstance(embeddings.input, str) else len(embeddings.input)
        return embeddings.model, False, "embeddings", [response(200, _embeddings(embeddings), keep)], inputs
    req = _COMPLETION.decode(body)
    answer = _completion(req, stub)
    prompts = 1 if isinstance(req.prompt, str) else len(req.prompt)
    sequences = prompts * max(req.n, req.best_of or 1)
    if not req.stream:
        return req.model, False, "completion", [response(200, answer[0], keep)], sequences
    head = STREAM_HEAD + (b"\r\n" if keep else b"connection: close\r\n\r\n")
    return req.model, True, "completion", [head + chunked(answer[:1]), *(chunked([f]) for f in answer[1:]),
                                           CHUNKED_END], sequences


def _start(stub: StubState, proto: HttpProtocol, line: str) -> None:
    """Count the request in flight, with the chat requests, and write its `--log` line."""
    proto.counted = True
    stub.in_flight += 1
    stub.max_concurrent = max(stub.max_concurrent, stub.in_flight)
    if stub.log_fd is not None:
        scheduler = stub.scheduler
        seqs = f" waiting={scheduler.waiting} seqs={scheduler.used}" if scheduler is not None else ""
        text = (f"{time.time():.3f} {line} in_flight={stub.in_flight} max_concurrent={stub.max_concurrent}{seqs}"
                f"{stub.logged_body(proto)}\n")
        os.write(stub.log_fd, text.encode())


def _words(text: str) -> int:
    return len(text.split())


# --- completions -----------------------------------------------------------------------


def _pieces(req: CompletionRequest, tokens: int) -> tuple[list[str], str, str | None]:
    """The answer's pieces, its finish_reason and stop_reason."""
    limit = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    count, finish = (tokens, "stop") if tokens <= limit else (max(limit, 0), "length")
    pieces = list(content_pieces(count))
    if req.suffix is not None:  # fill in the middle: the words backwards (see the module doc)
        pieces = [("" if i == 0 else " ") + WORDS[-1 - i % len(WORDS)] for i in range(count)]
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    text = "".join(pieces)
    found = min(((text.find(s), s) for s in stops if s and s in text), default=None)
    if found is None:
        return pieces, finish, None
    cut, used, out = found[0], 0, []
    for piece in pieces:
        if used + len(piece) >= cut:
            if cut > used:
                out.append(piece[: cut - used])
            break
        out.append(piece)
        used += len(piece)
    return out, "stop", found[1]


def _logprobs(pieces: list[str], offset: int) -> dict[str, Any]:
    """vLLM's legacy completions logprobs: one entry per piece."""
    offsets, at = [], offset
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {"tokens": pieces, "token_logprobs": [-0.5] * len(pieces),
            "top_logprobs": [{piece: -0.5} for piece in pieces], "text_offset": offsets}


def _completion(req: CompletionRequest, stub: StubState) -> list[bytes]:
    """The answer: one JSON body, or the SSE frames of a stream."""
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not prompts or req.n < 1:
        raise ValueError("`prompt` must not be empty and `n` must be at least 1.")
    pieces, finish, stop_reason = _pieces(req, stub.config.tokens)
    stub.counter += 1
    rid, created = f"cmpl-{stub.prefix}{stub.counter:08x}", int(time.time())
    prompt_tokens = sum(_words(p) for p in prompts)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces) * req.n * len(prompts),
             "total_tokens": prompt_tokens + len(pieces) * req.n * len(prompts)}
    head: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": req.model}
    indices = range(req.n * len(prompts))
    if not req.stream:
        choices = []
        for i in indices:
            prompt = prompts[i // req.n]
            text = (prompt if req.echo else "") + "".join(pieces)
            logprobs = _logprobs(pieces, len(prompt) if req.echo else 0) if req.logprobs is not None else None
            choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish,
                            "stop_reason": stop_reason, "prompt_logprobs": None})
        return [encode({**head, "choices": choices, "usage": usage})]

    def frame(choices: list[dict[str, Any]], chunk_usage: dict[str, int] | None = None) -> bytes:
        return b"data: " + encode({**head, "choices": choices, "usage": chunk_usage}) + b"\n\n"

    frames = []
    if req.echo:
        frames.append(frame([{"index": i, "text": prompts[i // req.n], "logprobs": None, "finish_reason": None,
                              "stop_reason": None} for i in indices]))
    for piece in pieces:
        logprobs = _logprobs([piece], 0) if req.logprobs is not None else None
        frames += [frame([{"index": i, "text": piece, "logprobs": logprobs, "finish_reason": None,
                           "stop_reason": None}]) for i in indices]
    frames += [frame([{"index": i, "text": "", "logprobs": None, "finish_reason": finish,
                       "stop_reason": stop_reason}]) for i in indices]
    if stub.config.stream_usage and req.stream_options is not None and req.stream_options.include_usage:
        frames.append(frame([], usage))
    frames.append(b"data: [DONE]\n\n")
    return frames


# --- embeddings ------------------------------------------------------------------------


def vector(text: str, dimensions: int) -> list[float]:
    """A unit vector that depends only on `text` (and its first k components on nothing else)."""
    values: list[float] = []
    block = 0
    while len(values) < dimensions:
        digest = hashlib.sha256(f"{block}:{text}".encode()).digest()
        values += [(b - 127.5) / 127.5 for b in digest]
        block += 1
    values = values[:dimensions]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]


def _embeddings(req: EmbeddingRequest) -> bytes:
    inputs = [req.input] if isinstance(req.input, str) else req.input
    dimensions = DEFAULT_DIMENSIONS if req.dimensions is None else req.dimensions
    if not inputs:
        raise ValueError("`input` must not be empty.")
    if not 1 <= dimensions <= MAX_DIMENSIONS:
        raise ValueError(f"`dimensions` must be between 1 and {MAX_DIMENSIONS}.")
    if req.encoding_format not in ("float", "base64"):
        raise ValueError("`encoding_format` must be 'float' or 'base64'.")
    data: list[dict[str, Any]] = []
    for i, text in enumerate(inputs):
        values: list[float] | str = vector(text, dimensions)
        if req.encoding_format == "base64":
            values = base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode()
        data.append({"index": i, "object": "embedding", "embedding": values})
    tokens = sum(_words(text) for text in inputs)
    return encode({"id": f"embd-{hashlib.sha256(req.model.encode()).hexdigest()[:8]}", "object": "list",
                   "created": int(time.time()), "model": req.model, "data": data,
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                             "prompt_tokens_details": None}})
