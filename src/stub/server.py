"""The stub upstream's routes, in-flight accounting and --log, served under uvloop.

A chat request that needs no waiting (no --hold, no --chunk-delay, a free place under
--max-num-seqs, no --prefix-cache) is answered synchronously inside ``data_received``,
without creating a task: the stub is the upstream of every benchmark and must stay well
over twice as fast as the gateway in front of it. Only held, slowly streamed or waiting
answers get a task, which the connection cancels when the client goes away; the request
then stops counting as in flight at once (a vLLM abort).

With ``--max-num-seqs N`` (``stub.scheduler``) a request beyond N waits inside the stub,
as in vLLM's scheduler; its hold, prefill and chunk delays start when it starts
generating. ``GET /metrics`` then serves vLLM 0.32's scheduler gauges (``stub.metrics``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from stub import generate
from stub.answers import Answer, build_answer
from stub.chat_wire import DONE_FRAME, completion_body, stream_frames, stream_parts
from stub.connection import CHUNKED_END, STREAM_HEAD, HttpProtocol, chunked, response
from stub.faults import HTTP_FAULTS, FaultPicker, answer_fault, http_fault, stream_fault
from stub.prefix_cache import DEFAULT_CAPACITY, PrefixCache
from stub.scheduler import Scheduler
from stub.schema import (
    BUDGET_INVALID,
    BUDGET_REFUSAL,
    CHAT_DECODER,
    MAX_MODEL_LEN,
    USER_PREFIX,
    ChatRequest,
    context_refusal,
    encode,
    error_body,
    last_user_text,
    message_texts,
    token_ids,
    tokenize_body,
)

METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
Play = Callable[[int | None], Awaitable[None]]  # plays an answer, given its cached prompt tokens


@dataclass(frozen=True, slots=True)
class StubConfig:
    """The stub's knobs; see ``stub.cli`` for their meaning."""

    hold: float = 0.0
    tokens: int = 16
    reasoning: bool = False
    error_rate: float = 0.0
    seed: int = 0
    log_path: str | None = None
    log_headers: bool = False  # header names on each --log line (what a gateway forwarded)
    log_bodies: bool = False  # the JSON body received at the end of each --log line
    models: tuple[str, ...] = ()
    chunk_delay: float = 0.0
    stream_usage: bool = True  # False: ignore include_usage, as llama.cpp's server does
    fault: str | None = None  # a kind of stub.faults.KINDS, or "random"
    fault_rate: float = 1.0
    fault_after: int = 0  # chat requests answered normally before the faults begin
    max_num_seqs: int | None = None  # None: every request generates at once
    prefix_cache: bool = False
    prefix_cache_blocks: int = DEFAULT_CAPACITY
    prefill_ms_per_1k_tokens: float = 50.0  # with prefix_cache: per 1,000 uncached prompt tokens
    max_model_len: int = MAX_MODEL_LEN  # prompt + output tokens of one sequence, as vLLM's --max-model-len


class Rejected(Exception):
    """A chat request answered with an error before it starts: no log line, never in flight.

    `in_stream`: refused by the engine rather than the HTTP layer, which vLLM does only once a
    streamed answer's 200 is out: a stream request then gets its error as the first SSE frame,
    then `[DONE]` (a plain request still gets the status).
    """

    def __init__(self, status: int, message: str, param: str | None = None, in_stream: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.in_stream = status, message, param, in_stream


class Stub:
    """State shared by all connections: in-flight accounting, log, error RNG, ids; routing."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.log_headers = config.log_headers and bool(config.log_path)
        self.log_bodies = config.log_bodies and bool(config.log_path)
        self.rng = random.Random(config.seed)
        self.faults = (
            FaultPicker(config.fault, config.fault_rate, self.rng, config.fault_after) if config.fault else None
        )
        self.scheduler = Scheduler(config.max_num_seqs) if config.max_num_seqs else None
        self.cache = PrefixCache(config.prefix_cache_blocks) if config.prefix_cache else None
        # answered inside data_received when nothing makes it wait (see the module's doc)
        self.immediate = not config.hold and self.cache is None
        self.metrics_body: Callable[[], bytes] | None = None
        if self.scheduler is not None:
            from stub.metrics import scheduler_metrics  # prometheus_client: only loaded when served

            self.metrics_body = scheduler_metrics(self.scheduler, (config.models or ("stub",))[0])
        self.in_flight = 0
        self.max_concurrent = 0
        self.counter = 0
        self.prefix = os.urandom(4).hex()
        self.log_fd: int | None = None
        if config.log_path:  # O_TRUNC: the log starts empty; os.write is write+flush per line
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
            self.log_fd = os.open(config.log_path, flags, 0o644)
        now = int(time.time())
        cards = [
            {
                "id": m,
                "object": "model",
                "created": now,
                "owned_by": "stub",
                "root": m,
                "parent": None,
                "max_model_len": config.max_model_len,
            }
            for m in config.models or ("stub",)
        ]
        self.models_body = encode({"object": "list", "data": cards})

    def close(self) -> None:
        if self.log_fd is not None:
            os.close(self.log_fd)
            self.log_fd = None

    def start(
        self, proto: HttpProtocol, req: ChatRequest, fault: str | None = None,
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
        self.in_flight += 1
        self.max_concurrent = max(self.max_concurrent, self.in_flight)
        if self.log_fd is not None:
            line = (
                f"{time.time():.3f} chat start in_flight={self.in_flight} "
                f"max_concurrent={self.max_concurrent} model={encode(req.model).decode()} "
                f"stream={'true' if req.stream else 'false'} "
                f"roles={encode([m.role for m in req.messages]).decode()} "
                f"user={encode(last_user_text(req.messages)[:USER_PREFIX]).decode()}"
                + (f" traceparent={proto.traceparent.decode('latin-1')}" if proto.traceparent else "")
                + (f" headers={proto.header_names.decode('latin-1')}" if self.log_headers else "")
                + (f" waiting={self.scheduler.waiting} seqs={self.scheduler.used}" if self.scheduler is not None
                   else "")
                + (f" prompt_tokens={prompt} cached_tokens={cached}" if cached is not None else "")
                + (f" fault={fault}" if fault else "")
                + self.logged_body(proto)
                + "\n"
            )
            os.write(self.log_fd, line.encode())

    def logged_body(self, proto: HttpProtocol) -> str:
        """`` body={...}`` (the request's JSON, compact) with --log-bodies, else nothing."""
        if not self.log_bodies:
            return ""
        try:
            return " body=" + encode(msgspec.json.decode(proto.request_body)).decode()
        except msgspec.DecodeError:
            return " body=" + encode(proto.request_body.decode(errors="replace")).decode()

    def release(self, proto: HttpProtocol) -> None:
        """Idempotent: called when the answer is written and when the client goes away."""
        if proto.counted:
            proto.counted = False
            self.in_flight -= 1

    def handle(
        self, proto: HttpProtocol, method: bytes, path: bytes, body: bytes, keep: bool
    ) -> asyncio.Task[None] | None:
        """Answer one request; returns a task when the answer must wait (hold, chunk delay)."""
        if self.log_bodies:
            proto.request_body = body
        if path == b"/v1/chat/completions" and method == b"POST":
            return self.chat(proto, body, keep)
        if path in generate.PATHS and method == b"POST":  # text completions, embeddings
            return generate.handle(self, proto, path, body, keep)
        if path == b"/health" and method in (b"GET", b"HEAD"):
            proto.finish(response(200, b"", keep, b"text/plain"), keep)
        elif path == b"/v1/models" and method == b"GET":
            proto.finish(response(200, self.models_body, keep), keep)
        elif path == b"/metrics" and method == b"GET" and self.metrics_body is not None:
            proto.finish(response(200, self.metrics_body(), keep, METRICS_TYPE), keep)
        elif path == b"/tokenize" and method == b"POST":
            try:
                proto.finish(response(200, tokenize_body(body, self.config.max_model_len), keep), keep)
            except (msgspec.DecodeError, ValueError) as exc:
                proto.finish(response(400, error_body(400, str(exc)), keep), keep)
        else:
            message = f"Not Found: {method.decode(errors='replace')} {path.decode(errors='replace')}"
            proto.finish(response(404, error_body(404, message), keep), keep)
        return None

    def admit(self, body: bytes) -> tuple[ChatRequest, Answer]:
        """Decode and validate a chat request; raises Rejected before it starts (no log line)."""
        cfg = self.config
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
        if cfg.error_rate and self.rng.random() < cfg.error_rate:
            raise Rejected(500, "Injected failure (stub --error-rate).")
        return req, answer

    def chat(self, proto: HttpProtocol, body: bytes, keep: bool) -> asyncio.Task[None] | None:
        try:
            req, answer = self.admit(body)
        except Rejected as exc:
            if exc.in_stream:
                frames = [b"data: " + error_body(exc.status, exc.message, exc.param) + b"\n\n", DONE_FRAME]
                proto.finish(self._stream_head(keep) + chunked(frames) + CHUNKED_END, keep)
            else:
                proto.finish(response(exc.status, error_body(exc.status, exc.message, exc.param), keep), keep)
            return None
        if self.faults is not None:  # the only cost of fault injection without --fault
            fault = self.faults.draw()
            if fault is not None:
                return self._fault(proto, req, answer, keep, fault)
        if (
            self.immediate
            and not (req.stream and self.config.chunk_delay)
            and (self.scheduler is None or self.scheduler.free(req.sequences))
        ):
            rid, call_id, created = self._ids()
            if req.stream:
                frames = stream_frames(answer, rid, created, req.model, call_id, self._usage_wanted(req), req.n or 1)
                out = self._stream_head(keep) + chunked(frames) + CHUNKED_END
            else:
                out = response(200, completion_body(answer, rid, created, req.model, call_id, req.n or 1), keep)
            self.start(proto, req)
            self.release(proto)
            proto.finish(out, keep)
            return None

        def play(cached: int | None) -> Awaitable[None]:
            return self._generate(proto, req, answer, keep, cached)

        return self._later(proto, req, None, play)

    def _usage_wanted(self, req: ChatRequest) -> bool:
        return self.config.stream_usage and bool(req.stream_options and req.stream_options.include_usage)

    @staticmethod
    def _stream_head(keep: bool) -> bytes:
        return STREAM_HEAD + (b"\r\n" if keep else b"connection: close\r\n\r\n")

    def _ids(self) -> tuple[str, str, int]:
        """(completion id, tool call id, created) of the next answer."""
        self.counter += 1
        suffix = f"{self.prefix}{self.counter:08x}"
        return f"chatcmpl-{suffix}", f"chatcmpl-tool-{suffix}", int(time.time())

    def _later(self, proto: HttpProtocol, req: ChatRequest, fault: str | None, play: Play) -> asyncio.Task[None]:
        """A task answering later: counted in flight from its first step until it ends.

        Counting on the task's first step, not now, lets a connection loss seen in the same
        I/O batch (its callback was scheduled first) be counted first: a client that aborts
        one request and sends the next at once never shows both in flight. Under
        ``--max-num-seqs`` it waits for its turn to generate (in flight meanwhile, as a
        request waiting in vLLM is); a faulty one fails on its turn too.
        """

        async def run() -> None:
            scheduler, cache = self.scheduler, self.cache
            turn = scheduler.enter(req.sequences) if scheduler is not None else None
            cached, prompt = None, 0
            if cache is not None and fault is None:  # looked up (and kept) on arrival
                tokens = token_ids(message_texts(req.messages))
                cached, prompt = cache.serve(tokens), len(tokens)
            self.start(proto, req, fault, cached, prompt)
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
                self.release(proto)

        return asyncio.get_running_loop().create_task(run())

    def _fault(
        self, proto: HttpProtocol, req: ChatRequest, answer: Answer, keep: bool, fault: str
    ) -> asyncio.Task[None] | None:
        """Answer with an injected fault (see ``stub.faults``)."""
        if fault in HTTP_FAULTS:  # refused before it starts, like --error-rate: never in flight
            proto.finish(http_fault(fault, keep), keep)
            return None
        hold = self.config.hold
        rid, call_id, created = self._ids()
        if req.stream:
            frames = stream_frames(answer, rid, created, req.model, call_id, self._usage_wanted(req))
            head = self._stream_head(keep)
            return self._later(proto, req, fault, lambda _: stream_fault(proto, fault, head, frames, keep, hold))
        payload = response(200, completion_body(answer, rid, created, req.model, call_id), keep)
        return self._later(proto, req, fault, lambda _: answer_fault(proto, fault, payload, keep, hold))

    async def _generate(
        self, proto: HttpProtocol, req: ChatRequest, answer: Answer, keep: bool, cached: int | None
    ) -> None:
        """Generate an answer: the first token after hold (+ prefill), then one per chunk delay."""
        cfg = self.config
        wait = cfg.hold
        if cached is not None:
            answer = dataclasses.replace(answer, cached_tokens=cached)
            wait += cfg.prefill_ms_per_1k_tokens * (answer.prompt_tokens - cached) / 1e6
        rid, call_id, created = self._ids()
        if not req.stream:
            payload = response(200, completion_body(answer, rid, created, req.model, call_id, req.n or 1), keep)
            if wait:
                await asyncio.sleep(wait)
            proto.finish(payload, keep)
            return
        opening, tokens, closing = stream_parts(answer, rid, created, req.model, call_id, self._usage_wanted(req),
                                                req.n or 1)
        if wait:
            await asyncio.sleep(wait)
        delay = cfg.chunk_delay
        if not delay or len(tokens) < 2:
            proto.finish(self._stream_head(keep) + chunked(opening + tokens + closing) + CHUNKED_END, keep)
            return
        # The role chunk goes with the first token, as vLLM sends both on its first step;
        # the finish chunk, usage and [DONE] go with the last: no engine step between them.
        proto.write(self._stream_head(keep) + chunked(opening + tokens[:1]))
        for frame in tokens[1:-1]:
            await asyncio.sleep(delay)
            await proto.drain()
            proto.write(chunked([frame]))
        await asyncio.sleep(delay)
        await proto.drain()
        proto.finish(chunked(tokens[-1:] + closing) + CHUNKED_END, keep)


async def serve(config: StubConfig, host: str, port: int) -> None:
    """Run until SIGINT/SIGTERM; prints the bound address once listening."""
    loop = asyncio.get_running_loop()
    stub = Stub(config)
    server = await loop.create_server(lambda: HttpProtocol(stub), host, port, backlog=2048)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()
    print(f"stub listening on http://{host}:{bound[1]}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        stub.close()


def run_server(config: StubConfig, host: str, port: int) -> None:
    """Serve under uvloop (plain asyncio if uvloop is unavailable)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the stub usable anyway
        asyncio.run(serve(config, host, port))
    else:
        uvloop.run(serve(config, host, port))
