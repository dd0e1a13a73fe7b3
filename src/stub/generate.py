"""The stub's text completions (`POST /v1/completions`) and embeddings (`POST /v1/embeddings`).

Shaped like vLLM's answers, deterministic, and counted in flight with the chat requests
(one `--log` line each, `completion start ...` / `embeddings start ...`, with the shared
`in_flight=N max_concurrent=M`), so a test sees them under the same cap. `--hold` and
`--chunk-delay` apply, and `--max-num-seqs` counts their sequences with the chat requests
(each prompt's max(n, best_of), each embedding input); `--error-rate` and `--fault` are for
chat only, but for `--fault die-mid-stream`, which text completions meet too (their `--log`
line then ends `fault=die-mid-stream`).

- Completions: ``stub.completions`` (text and token-id prompts, continuations,
  ``return_token_ids``). A continuation's `--log` line adds `continued=G`, the generated ids
  at the end of its prompt.
- Embeddings: one vector per input, derived from SHA-256 of the input (the same input always
  gets the same vector), `dimensions` long (default 32, at most 4096), unit length;
  `encoding_format: "base64"` gives little-endian float32 bytes in base64, as OpenAI does.
  Usage: prompt tokens are the inputs' whitespace-separated words.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import os
import struct
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from stub.completions import COMPLETION_DECODER, CompletionWire, complete, prompts_of, render
from stub.connection import CHUNKED_END, STREAM_HEAD, chunked, response
from stub.faults import DIE_MID_STREAM, die_before_answer, die_mid_stream
from stub.schema import encode, error_body

if TYPE_CHECKING:
    from stub.connection import HttpProtocol
    from stub.state import StubState

PATHS = (b"/v1/completions", b"/v1/embeddings")
DEFAULT_DIMENSIONS, MAX_DIMENSIONS = 32, 4096


class EmbeddingRequest(msgspec.Struct):
    model: str
    input: str | list[str]
    dimensions: int | None = None
    encoding_format: str = "float"


_EMBEDDING = msgspec.json.Decoder(EmbeddingRequest)


@dataclass(frozen=True, slots=True)
class Reply:
    """A decided answer: the bytes to write in order (the last ends it), and what the
    `--log` line and the scheduler need. `wire` is a completion's, for a fault to cut."""

    model: str
    stream: bool
    kind: str  # "completion" or "embeddings"
    data: list[bytes]
    sequences: int
    detail: str = ""  # more of the --log line
    wire: CompletionWire | None = None


def handle(stub: StubState, proto: HttpProtocol, path: bytes, body: bytes, keep: bool) -> asyncio.Task[None] | None:
    """Answer one request on one of `PATHS`; a task when it must wait (`--hold`, `--chunk-delay`)."""
    config = stub.config
    try:
        reply = _answer(stub, path, body, keep)
    except (msgspec.DecodeError, ValueError) as exc:  # ValidationError is a DecodeError
        proto.finish(response(400, error_body(400, str(exc)), keep), keep)
        return None
    if config.models and reply.model not in config.models:
        proto.finish(response(404, error_body(404, f"The model `{reply.model}` does not exist."), keep), keep)
        return None
    fault = None
    if reply.wire is not None and stub.faults is not None and config.fault == DIE_MID_STREAM:
        fault = stub.faults.draw()  # completions count with the chat requests (--fault-after, --fault-limit)
    line = (f"{reply.kind} start model={encode(reply.model).decode()} stream={'true' if reply.stream else 'false'}"
            f"{reply.detail}")  # fmt: skip
    data, sequences = reply.data, reply.sequences
    paced = reply.stream and config.chunk_delay
    scheduler = stub.scheduler
    if fault is None and not config.hold and not paced and (scheduler is None or scheduler.free(sequences)):
        _start(stub, proto, line)
        stub.release(proto)
        proto.finish(b"".join(data), keep)
        return None

    async def later() -> None:
        turn = scheduler.enter(sequences) if scheduler is not None else None
        _start(stub, proto, line, fault)
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
        if fault is not None and reply.wire is not None and (
                not reply.stream or len(reply.wire.steps) > config.fault_after_tokens):  # else: ends before it dies
            await _die(stub, proto, reply, reply.wire, keep)
            return
        if config.hold:
            await asyncio.sleep(config.hold)
        if not paced:
            proto.finish(b"".join(data), keep)
            return
        for piece in data[:-2]:
            proto.write(piece)
            await asyncio.sleep(config.chunk_delay)
            await proto.drain()
        # [DONE] and the body's end go together, as a chat stream's last step does: a client
        # done at [DONE] never finds the request still in flight here.
        proto.finish(data[-2] + data[-1], keep)

    return asyncio.get_running_loop().create_task(later())


def _die(
    stub: StubState, proto: HttpProtocol, reply: Reply, wire: CompletionWire, keep: bool
) -> Coroutine[Any, Any, None]:
    """``--fault die-mid-stream`` on a completion: its first token steps, then a reset."""
    config = stub.config
    if not reply.stream:
        return die_before_answer(proto, config.hold)
    tokens = [frame for step in wire.steps[: config.fault_after_tokens] for frame in step]
    return die_mid_stream(proto, _stream_head(keep), wire.opening, tokens, config.hold, config.chunk_delay)


def _stream_head(keep: bool) -> bytes:
    return STREAM_HEAD + (b"\r\n" if keep else b"connection: close\r\n\r\n")


def _answer(stub: StubState, path: bytes, body: bytes, keep: bool) -> Reply:
    """The decided answer; raises ValueError / DecodeError (400). Sequences: each embedding
    input, each prompt's max(n, best_of)."""
    if path == b"/v1/embeddings":
        embeddings = _EMBEDDING.decode(body)
        inputs = 1 if isinstance(embeddings.input, str) else len(embeddings.input)
        return Reply(embeddings.model, False, "embeddings", [response(200, _embeddings(embeddings), keep)], inputs)
    req = COMPLETION_DECODER.decode(body)
    prompts = prompts_of(req)
    if req.n < 1:
        raise ValueError("`n` must be at least 1.")
    config = stub.config
    answers = [complete(req, prompt, config.tokens, config.reasoning) for prompt in prompts]
    stub.counter += 1
    rid, created = f"cmpl-{stub.prefix}{stub.counter:08x}", int(time.time())
    usage = config.stream_usage and req.stream_options is not None and bool(req.stream_options.include_usage)
    wire = render(req, prompts, answers, rid, created, usage)
    continued = sum(p.tail.generated for p in prompts)
    detail = f" continued={continued}" if continued else ""
    sequences = len(prompts) * max(req.n, req.best_of or 1)
    if wire.body is not None:
        return Reply(req.model, False, "completion", [response(200, wire.body, keep)], sequences, detail, wire)
    frames = [*wire.opening, *(frame for step in wire.steps for frame in step), *wire.closing]
    data = [_stream_head(keep) + chunked(frames[:1]), *(chunked([f]) for f in frames[1:]), CHUNKED_END]
    return Reply(req.model, True, "completion", data, sequences, detail, wire)


def _start(stub: StubState, proto: HttpProtocol, line: str, fault: str | None = None) -> None:
    """Count the request in flight, with the chat requests, and write its `--log` line (ending
    with ``fault=KIND``, before any ``body=``, when one is injected, as a chat line does)."""
    proto.counted = True
    stub.in_flight += 1
    stub.max_concurrent = max(stub.max_concurrent, stub.in_flight)
    if stub.log_fd is not None:
        scheduler = stub.scheduler
        seqs = f" waiting={scheduler.waiting} seqs={scheduler.used}" if scheduler is not None else ""
        text = (f"{time.time():.3f} {line} in_flight={stub.in_flight} max_concurrent={stub.max_concurrent}{seqs}"
                f"{f' fault={fault}' if fault else ''}{stub.logged_body(proto)}\n")
        os.write(stub.log_fd, text.encode())


def _words(text: str) -> int:
    return len(text.split())


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
