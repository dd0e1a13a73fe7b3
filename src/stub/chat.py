"""The stub's chat completions (`POST /v1/chat/completions`): admission, the --log line, pacing.

A chat request that needs no waiting (no --hold, no --chunk-delay, a free place under
--max-num-seqs, no --prefix-cache) is answered synchronously inside ``data_received``,
without creating a task: the stub is the upstream of every benchmark and must stay well
over twice as fast as the gateway in front of it. Only held, slowly streamed or waiting
answers get a task, which the connection cancels when the client goes away; the request
then stops counting as in flight at once (a vLLM abort).

With ``--max-num-seqs N`` (``stub.scheduler``) a request beyond N waits inside the stub,
as in vLLM's scheduler; its hold, prefill and chunk delays start when it starts
generating.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable

import msgspec

from stub.answers import Answer, build_answer
from stub.chat_wire import DONE_FRAME, completion_body, stream_frames, stream_parts
from stub.connection import CHUNKED_END, STREAM_HEAD, HttpProtocol, chunked, response
from stub.faults import (
    DIE_MID_STREAM,
    HTTP_FAULTS,
    answer_fault,
    die_before_answer,
    die_mid_stream,
    http_fault,
    stream_fault,
)
from stub.schema import (
    BUDGET_INVALID,
    BUDGET_REFUSAL,
    CHAT_DECODER,
    USER_PREFIX,
    ChatRequest,
    context_refusal,
    encode,
    error_body,
    last_user_text,
    message_texts,
    token_ids,
)
from stub.state import StubState

Play = Callable[[int | None], Awaitable[None]]  # plays an answer, given its cached prompt tokens


class Rejected(Exception):
    """A chat request answered with an error before it starts: no log line, never in flight.

    `in_stream`: refused by the engine rather than the HTTP layer, which vLLM does only once a
    streamed answer's 200 is out: a stream request then gets its error as the first SSE frame,
    then `[DONE]` (a plain request still gets the status).
    """

    def __init__(self, status: int, message: str, param: str | None = None, in_stream: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.in_stream = status, message, param, in_stream


def handle(stub: StubState, proto: HttpProtocol, body: bytes, keep: bool) -> asyncio.Task[None] | None:
    """Answer one chat request; returns a task when the answer must wait (hold, chunk delay)."""
    try:
        req, answer = admit(stub, body)
    except Rejected as exc:
        if exc.in_stream:
            frames = [b"data: " + error_body(exc.status, exc.message, exc.param) + b"\n\n", DONE_FRAME]
            proto.finish(_stream_head(keep) + chunked(frames) + CHUNKED_END, keep)
        else:
            proto.finish(response(exc.status, error_body(exc.status, exc.message, exc.param), keep), keep)
        return None
    if stub.faults is not None:  # the only cost of fault injection without --fault
        fault = stub.faults.draw()
        if fault is not None and not _spared(stub, req, answer, fault):
            return _fault(stub, proto, req, answer, keep, fault)
    if (
        stub.immediate
        and not (req.stream and stub.config.chunk_delay)
        and (stub.scheduler is None or stub.scheduler.free(req.sequences))
    ):
        rid, call_id, created = _ids(stub)
        return_ids = bool(req.return_token_ids)
        if req.stream:
            frames = stream_frames(answer, rid, created, req.model, call_id, _usage_wanted(stub, req), req.n or 1,
                                   return_ids)  # fmt: skip
            out = _stream_head(keep) + chunked(frames) + CHUNKED_END
        else:
            out = response(200, completion_body(answer, rid, created, req.model, call_id, req.n or 1, return_ids), keep)
        _start(stub, proto, req)
        stub.release(proto)
        proto.finish(out, keep)
        return None

    def play(cached: int | None) -> Awaitable[None]:
        return _generate(stub, proto, req, answer, keep, cached)

    return _later(stub, proto, req, None, play)


def admit(stub: StubState, body: bytes) -> tuple[ChatRequest, Answer]:
    """Decode and validate a chat request; raises Rejected before it starts (no log line)."""
    cfg = stub.config
    try:
        req = CHAT_DECODER.decode(body)
        budget = req.thinking_token_budget
        if budget is not None and budget < -1:
            raise Rejected(400, BUDGET_INVALID)
        answer = build_answer(req, cfg.tokens, cfg.reasoning, cfg.max_model_len)
    except msgspec.ValidationError as exc:
        raise Rejected(400, str(exc)) from exc
    except msgspec.DecodeError as exc:
        raise Rejected(400, f"Invalid JSON: {exc}") from exc
    except ValueError as exc:
        raise Rejected(400, str(exc)) from exc
    if cfg.models and req.model not in cfg.models:
        raise Rejected(404, f"The model `{req.model}` does not exist.")
    if answer.prompt_tokens >= cfg.max_model_len:  # no room for one output token: vLLM 0.32's refusal
        requested = req.max_completion_tokens if req.max_tokens is None else req.max_tokens
        raise Rejected(400, *context_refusal(answer.prompt_tokens, requested, cfg.max_model_len))
    if budget is not None and budget != -1 and not cfg.reasoning:  # vLLM's engine refuses it
        raise Rejected(400, BUDGET_REFUSAL, in_stream=bool(req.stream))
    if cfg.error_rate and stub.rng.random() < cfg.error_rate:
        raise Rejected(500, "Injected failure (stub --error-rate).")
    return req, answer


def _start(
    stub: StubState, proto: HttpProtocol, req: ChatRequest, fault: str | None = None,
    cached: int | None = None, prompt: int = 0,
) -> None:
    """Count a started chat request and log its line (with ``fault=KIND`` when one is injected).

    ``roles=[...]`` lists the request's message roles in order (a JSON array without
    spaces, like ``model``), so a test can see where system messages arrived; with
    ``user="..."`` is the start of the last user message's text (a JSON string, at most
    USER_PREFIX characters), so a test can tell whose request it was; with
    ``--log-headers``, ``headers=a,b`` names the headers received (names only: a test
    proves no credential was forwarded without the stub ever writing one down). With
    ``--max-num-seqs``, ``waiting=W`` counts the requests received and not generating
    once this one arrived (itself included when it must wait: W > 0 means a request
    queued inside the server) and ``seqs=S`` the sequences generating (a request for n
    choices is n); with ``--prefix-cache``, ``prompt_tokens=P cached_tokens=C``; with
    ``--log-bodies``, ``body=`` and the JSON body received, compact, ends the line.
    """
    proto.counted = True
    stub.in_flight += 1
    stub.max_concurrent = max(stub.max_concurrent, stub.in_flight)
    if stub.log_fd is not None:
        line = (
            f"{time.time():.3f} chat start in_flight={stub.in_flight} "
            f"max_concurrent={stub.max_concurrent} model={encode(req.model).decode()} "
            f"stream={'true' if req.stream else 'false'} "
            f"roles={encode([m.role for m in req.messages]).decode()} "
            f"user={encode(last_user_text(req.messages)[:USER_PREFIX]).decode()}"
            + (f" traceparent={proto.traceparent.decode('latin-1')}" if proto.traceparent else "")
            + (f" headers={proto.header_names.decode('latin-1')}" if stub.log_headers else "")
            + (f" waiting={stub.scheduler.waiting} seqs={stub.scheduler.used}" if stub.scheduler is not None
               else "")
            + (f" prompt_tokens={prompt} cached_tokens={cached}" if cached is not None else "")
            + (f" fault={fault}" if fault else "")
            + stub.logged_body(proto)
            + "\n"
        )
        os.write(stub.log_fd, line.encode())


def _usage_wanted(stub: StubState, req: ChatRequest) -> bool:
    return stub.config.stream_usage and bool(req.stream_options and req.stream_options.include_usage)


def _stream_head(keep: bool) -> bytes:
    return STREAM_HEAD + (b"\r\n" if keep else b"connection: close\r\n\r\n")


def _ids(stub: StubState) -> tuple[str, str, int]:
    """(completion id, tool call id, created) of the next answer."""
    stub.counter += 1
    suffix = f"{stub.prefix}{stub.counter:08x}"
    return f"chatcmpl-{suffix}", f"chatcmpl-tool-{suffix}", int(time.time())


def _later(
    stub: StubState, proto: HttpProtocol, req: ChatRequest, fault: str | None, play: Play
) -> asyncio.Task[None]:
    """A task answering later: counted in flight from its first step until it ends.

    Counting on the task's first step, not now, lets a connection loss seen in the same
    I/O batch (its callback was scheduled first) be counted first: a client that aborts
    one request and sends the next at once never shows both in flight. Under
    ``--max-num-seqs`` it waits for its turn to generate (in flight meanwhile, as a
    request waiting in vLLM is); a faulty one fails on its turn too.
    """

    async def run() -> None:
        scheduler, cache = stub.scheduler, stub.cache
        turn = scheduler.enter(req.sequences) if scheduler is not None else None
        cached, prompt = None, 0
        if cache is not None and fault is None:  # looked up (and kept) on arrival
            tokens = token_ids(message_texts(req.messages))
            cached, prompt = cache.serve(tokens), len(tokens)
        _start(stub, proto, req, fault, cached, prompt)
        try:
            if scheduler is None:
                await play(cached)
                return
            if turn is not None:
                await scheduler.wait(turn)
            try:
                await play(cached)
            finally:
                scheduler.leave(req.sequences)
        finally:
            stub.release(proto)

    return asyncio.get_running_loop().create_task(run())


def _spared(stub: StubState, req: ChatRequest, answer: Answer, fault: str) -> bool:
    """A stream that dies after N tokens and has no more than N to send ends before it dies."""
    return fault == DIE_MID_STREAM and bool(req.stream) and answer.completion_tokens <= stub.config.fault_after_tokens


def _fault(
    stub: StubState, proto: HttpProtocol, req: ChatRequest, answer: Answer, keep: bool, fault: str
) -> asyncio.Task[None] | None:
    """Answer with an injected fault (see ``stub.faults``)."""
    if fault in HTTP_FAULTS:  # refused before it starts, like --error-rate: never in flight
        proto.finish(http_fault(fault, keep), keep)
        return None
    cfg = stub.config
    hold, return_ids = cfg.hold, bool(req.return_token_ids)
    rid, call_id, created = _ids(stub)
    if fault == DIE_MID_STREAM:
        if not req.stream:
            return _later(stub, proto, req, fault, lambda _: die_before_answer(proto, hold))
        n = req.n or 1
        opening, tokens, _ = stream_parts(answer, rid, created, req.model, call_id, False, n, return_ids)
        sent, head = tokens[: cfg.fault_after_tokens * n], _stream_head(keep)  # each token once per choice
        return _later(stub, proto, req, fault,
                      lambda _: die_mid_stream(proto, head, opening, sent, hold, cfg.chunk_delay))  # fmt: skip
    if req.stream:
        usage = _usage_wanted(stub, req)
        frames = stream_frames(answer, rid, created, req.model, call_id, usage, return_ids=return_ids)
        head = _stream_head(keep)
        return _later(stub, proto, req, fault, lambda _: stream_fault(proto, fault, head, frames, keep, hold))
    payload = response(200, completion_body(answer, rid, created, req.model, call_id, return_ids=return_ids), keep)
    return _later(stub, proto, req, fault, lambda _: answer_fault(proto, fault, payload, keep, hold))


async def _generate(
    stub: StubState, proto: HttpProtocol, req: ChatRequest, answer: Answer, keep: bool, cached: int | None
) -> None:
    """Generate an answer: the first token after hold (+ prefill), then one per chunk delay."""
    cfg = stub.config
    wait = cfg.hold
    if cached is not None:
        answer = dataclasses.replace(answer, cached_tokens=cached)
        wait += cfg.prefill_ms_per_1k_tokens * (answer.prompt_tokens - cached) / 1e6
    rid, call_id, created = _ids(stub)
    return_ids = bool(req.return_token_ids)
    if not req.stream:
        payload = response(200, completion_body(answer, rid, created, req.model, call_id, req.n or 1, return_ids), keep)
        if wait:
            await asyncio.sleep(wait)
        proto.finish(payload, keep)
        return
    opening, tokens, closing = stream_parts(answer, rid, created, req.model, call_id, _usage_wanted(stub, req),
                                            req.n or 1, return_ids)
    if wait:
        await asyncio.sleep(wait)
    delay = cfg.chunk_delay
    if not delay or len(tokens) < 2:
        proto.finish(_stream_head(keep) + chunked(opening + tokens + closing) + CHUNKED_END, keep)
        return
    # The role chunk goes with the first token, as vLLM sends both on its first step;
    # the finish chunk, usage and [DONE] go with the last: no engine step between them.
    proto.write(_stream_head(keep) + chunked(opening + tokens[:1]))
    for frame in tokens[1:-1]:
        await asyncio.sleep(delay)
        await proto.drain()
        proto.write(chunked([frame]))
    await asyncio.sleep(delay)
    await proto.drain()
    proto.finish(chunked(tokens[-1:] + closing) + CHUNKED_END, keep)
