"""What every dialect Router shares: one record per request, bodies, hang-ups, streams.

`EdgeMiddleware` wraps the Litestar app (around its routing and exception handling): it
makes each request's `Call` (request id, the record the observer gets) and stamps
`x-request-id` on the response. A dialect Router begins the call's record once Litestar
has routed the request to it (`Call.begin`, the Router's `before_request`), and the
middleware reports a begun record once the last byte went out or the client left;
requests no dialect took (health checks, the OpenAPI document) report none.

Why around the app and not as each Router's middleware: Litestar puts a second
exception-handling layer between a route's middleware and its handler (so that the
middleware's send wrapper sees the error responses), one more coroutine on every message
sent, per token of a stream. Around the app, Litestar's own app-level exception handling
renders a dialect's errors (with the Router's handlers) inside this middleware's send.

Hang-ups: Litestar stops a streaming body when `http.disconnect` arrives, but nothing
notices a client that leaves while its handler has sent nothing yet (queued, or
waiting on a non-streaming upstream). `Call.watch` covers that: after the body is
read, a hang-up cancels the handler's task; the middleware absorbs that cancellation and
records a 499. The gateway's own server protocol (`http_guard`) says so the moment the
connection is lost (`note_hang_up`; it marks each request's scope with `HANG_UP_NOTICE`);
under any other ASGI server a small task waits on `receive()` instead, started only once
the request has run 5 ms. A client that stops reading
is dropped below the app (`http_guard`, `client_write_timeout_seconds`), which the app
sees as a hang-up; `note_stalled` marks the request so its record says `client_stalled`.

A burst of new requests starts a few per turn of the event loop (`arrivals.ArrivalPacer`,
the first thing the middleware does), so the streams in flight keep getting their tokens.

At its end a request leaves no reference cycle: the middleware takes the `Call` out of
the scope's state and the `Call` drops the server's `receive`, the task and the body, so
the request's objects are freed at once (the ceiling's stack leaves none either).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from litestar import Request
from litestar.exceptions import InternalServerException
from litestar.response import Stream

from adapters.deadline import Deadline
from adapters.inbound._shared.arrivals import ArrivalPacer
from adapters.inbound._shared.limits import MAX_MODEL_CHARS
from application.consumer_limits import Door
from domain.consumers import ANONYMOUS_IDENTITY, Identity, RateSnapshot
from domain.errors import GatewayError, RequestTimeout
from domain.records import RequestRecord
from ports.telemetry import RequestObserver

_KEY = "gateway.call"
HANG_UP_NOTICE = "gateway.hang_up_notice"  # in a scope's state: the server calls `note_hang_up`
BODY_RECEIVED = "gateway.body_received"  # in a scope's state: the server has the whole request body
# The watcher task starts only once a request has run this long: a task, a wake-up and a
# cancellation per request cost more than a fast answer; a hang-up is noticed this late.
_WATCH_AFTER = 0.005
# The content type Litestar would set for `media_type=text/event-stream` given first: it fills it
# in with `setdefault` on its header list, which decodes and lowercases every header already
# there twice and raises a KeyError when it is absent (see `json_answer`). No buffering by
# nginx or an ingress.
_SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                "x-accel-buffering": "no"}
CLIENT_STALLED = "client_stalled"  # the record's error_kind of a client dropped for not reading


class ClientGone(GatewayError):
    """The client hung up before its request body arrived: nobody reads the answer."""

    status = 499
    kind = "client-gone"
    title = "Client closed the request"


class Closable(Protocol):
    async def aclose(self) -> None: ...


class Call:
    """One request at the edge: its id, its record, and its hang-up watcher."""

    __slots__ = ("_cancelled", "_noticed", "_receive", "_t0", "_task", "_watcher", "_watching", "body", "door",
                 "gone", "handle", "header_bytes", "identity", "observer", "record", "request_id", "stalled",
                 "started")  # fmt: skip

    def __init__(self, scope: Any, receive: Any) -> None:
        self._t0 = time.perf_counter()
        self._receive = receive
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | asyncio.TimerHandle | None = None
        self._watching = False
        state = scope.get("state")
        self._noticed = state is not None and HANG_UP_NOTICE in state  # the server calls `note_hang_up`
        self._cancelled = False
        self.gone = False
        self.stalled = False  # dropped for not reading its answer (`note_stalled`)
        self.started = False
        self.body: Closable | None = None  # a streaming body, closed by the middleware
        # Who the request is for: the edge checks replace it when keys are required.
        self.identity: Identity = ANONYMOUS_IDENTITY
        self.door: Door | None = None  # the consumer slot the edge checks took, released at the end
        self.observer: RequestObserver | None = None  # who gets the record: set by `begin`
        self.handle: object = None  # the observer's, from `request_started`
        # One pass over the headers: their size (for `max_header_bytes`) and x-request-id.
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        incoming: bytes | None = None
        session: bytes | None = None
        for key, value in scope["headers"]:
            size += len(key) + len(value)
            if key == b"x-request-id" and incoming is None:
                incoming = value
            elif key == b"x-claude-code-session-id" and session is None:
                session = value
        self.header_bytes = size
        self.request_id = _usable_request_id(incoming) or os.urandom(16).hex()
        self.record = RequestRecord(
            request_id=self.request_id, surface="", route="",  # `begin` names them, once routed
            method=scope.get("method", "GET"), status=0, duration_seconds=0.0,
            session_id=_usable_request_id(session),  # logged and traced, never sent upstream
        )

    def begin(self, surface: str, observer: RequestObserver, scope: Any) -> None:
        """A dialect's Router took the request (Litestar routed it): its record is labelled with
        the surface and the route template, started with `observer`, and reported at the end."""
        if self.observer is not None:
            return
        route: str = scope.get("path_template") or scope["path"]
        if route.endswith("{path:path}"):  # a dialect's catch-all: one label, whatever the path
            route = route[: -len("{path:path}")] + "*"
        record = self.record
        record.surface, record.route = surface, route
        self.observer = observer
        self.handle = observer.request_started(record, scope["headers"])

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    # --- hang-ups while nothing was sent ------------------------------------------------

    def watch(self) -> None:
        """Cancel the current task when the client hangs up (call after the body is read)."""
        self._task = asyncio.current_task()
        self._watching = True
        if not self._noticed:  # no word from the server: ask `receive()` (module doc)
            self._watcher = asyncio.get_running_loop().call_later(_WATCH_AFTER, self._start_watching)

    def hung_up(self) -> None:
        """The client left: the request is gone, and a watched task is cancelled."""
        self.gone = True
        if self._watching:
            self._watching = False
            if self._task is not None:
                self._cancelled = True
                self._task.cancel()

    def _start_watching(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        self.hung_up()

    def stop_watching(self) -> None:
        self._watching = False
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()  # a pending timer or a running task: either way it stops here

    def absorb_cancel(self) -> bool:
        """True when the watcher caused the cancellation in flight (the client left)."""
        if not self._cancelled or self._task is None:
            return False
        self._cancelled = False
        self._task.uncancel()
        return True

    def forget(self, scope: Any) -> None:
        """Drop what ties the request's objects into cycles (the scope's state holds the `Call`,
        the `Call` the server's `receive`, which holds the scope, and the request's task), so
        they are freed when the request ends, not by the cyclic GC much later."""
        state = scope.get("state")
        if state is not None and state.get(_KEY) is self:
            del state[_KEY]
        self._receive = self._task = self._watcher = self.body = self.door = self.handle = None

    def close_record(self) -> RequestRecord:
        record = self.record
        if self.gone and not self.started:
            record.status = 499
        record.client_gone = self.gone
        record.duration_seconds = self.elapsed()
        model = record.model
        if model is not None and len(model) > MAX_MODEL_CHARS:  # the decoders refuse longer names
            record.model = model[:MAX_MODEL_CHARS]
        return record


def call_of(request: Request[Any, Any, Any]) -> Call:
    call: Call = request.scope["state"][_KEY]
    return call


def note_hang_up(scope: Any) -> None:
    """The server lost the connection of the request of `scope` before its response's end."""
    call: Call | None = (scope.get("state") or {}).get(_KEY)
    if call is not None:
        call.hung_up()


def note_stalled(scope: Any) -> str | None:
    """Mark the request of `scope` as dropped for not reading; its request id, if it has one."""
    call: Call | None = (scope.get("state") or {}).get(_KEY)
    if call is None:
        return None
    call.stalled = True
    return call.request_id


class EdgeMiddleware:
    """Around the Litestar app, per request: its turn to start (`arrivals`), its `Call`,
    `x-request-id` on the response, and the begun record to its observer at the end (module
    doc). `app` is the Litestar app; `pacer`, when given, spreads a burst of new requests
    over the event loop's turns."""

    __slots__ = ("app", "pacer")

    def __init__(self, app: Any, pacer: ArrivalPacer | None = None) -> None:
        self.app = app
        self.pacer = pacer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # the lifespan
            await self.app(scope, receive, send)
            return
        call = Call(scope, receive)  # first: its duration counts a wait for its turn
        scope.setdefault("state", {})[_KEY] = call
        pacer = self.pacer
        turn = None if pacer is None else pacer.enter()
        if turn is not None:  # a burst: the tokens of the streams in flight go first
            try:
                await turn
            except asyncio.CancelledError:
                call.forget(scope)
                raise
            if call.gone:  # the client left while its request waited for its turn (`note_hang_up`)
                call.forget(scope)
                return  # nothing started, nobody to answer
        request_id = (b"x-request-id", call.request_id.encode())
        record = call.record

        answered = False  # the last byte of the response was handed to the server

        def send_with_id(message: Any) -> Awaitable[None]:
            # A plain function returning the server's awaitable: no coroutine of ours per frame.
            nonlocal answered
            kind = message["type"]
            if kind == "http.response.start":
                call.started = True
                record.status = message["status"]
                message["headers"] = [*message.get("headers", ()), request_id]
            elif kind == "http.response.body" and not message.get("more_body", False):
                answered = True
            return send(message)  # type: ignore[no-any-return]

        async def receive_noting_hang_up() -> Any:
            message = await receive()
            # After the last byte the server reports every request as disconnected: not a hang-up.
            if message["type"] == "http.disconnect" and not answered:
                call.gone = True  # a stream stops at its next frame (`StreamBody`)
            return message

        try:
            await self.app(scope, receive_noting_hang_up, send_with_id)
        except asyncio.CancelledError:
            if not call.absorb_cancel():
                raise
        finally:
            call.stop_watching()
            body, door = call.body, call.door
            try:
                if body is not None:
                    if not answered:  # Litestar stopped before the body's end: the client left mid-stream
                        call.gone = True
                    await body.aclose()  # Litestar does not close it; its `finally` frees the slot now
            finally:
                if door is not None:
                    await door.release()  # the consumer's slot, taken by the edge checks
            observer = call.observer
            if observer is not None:  # a dialect took the request
                if call.stalled:  # dropped below the app: to the app it was a hang-up
                    call.gone = True
                    record.error_kind = CLIENT_STALLED
                observer.request_finished(call.close_record(), call.handle)
            call.forget(scope)  # no reference cycle left for the cyclic GC (module doc)


async def read_body(request: Request[Any, Any, Any], timeout: float | None) -> bytes:
    """The body through Litestar (its `request_max_body_size` answers 413), within `timeout`.

    No timer when the server says the whole body is already there (`BODY_RECEIVED`, set by
    `http_guard`: a small body comes with its head): reading it cannot wait."""
    try:
        if timeout is None or BODY_RECEIVED in request.scope["state"]:
            return await request.body()
        try:
            with Deadline(timeout):  # asyncio.timeout's rule, without its coroutines (adapters/deadline.py)
                return await request.body()
        except TimeoutError:
            raise RequestTimeout(f"The request body was not received within {timeout:g} seconds.") from None
    except InternalServerException:  # Litestar's word for a disconnect while the body streams in
        call_of(request).gone = True
        raise ClientGone from None


class StreamBody:
    """A Stream's iterator: the first frame (awaited before the response), then the rest.

    The middleware closes it after the response, so a generator Litestar stopped
    iterating (a hang-up during a send) runs its `finally` at once, not at GC.

    It also ends at the first frame asked for after the client left. Litestar cancels its
    sending task on `http.disconnect`, but anyio delivers that cancellation only while the
    task waits on something not yet ready: a fast upstream whose data is always ready keeps
    it running (uvicorn's `send` on a lost connection returns at once), so without this the
    slot would be held until the upstream paused.

    `__anext__` is a plain method handing back the frames' own awaitable (or raising
    StopAsyncIteration itself), so a frame passes through no coroutine of this class.
    """

    __slots__ = ("_call", "_first", "_rest")

    def __init__(self, first: bytes, rest: AsyncIterator[bytes], call: Call) -> None:
        self._first: bytes | None = first
        self._rest = rest
        self._call = call

    def __aiter__(self) -> StreamBody:
        return self

    def __anext__(self) -> Awaitable[bytes]:
        first = self._first
        if first is not None:
            self._first = None
            return _ready(first)
        call = self._call
        if call.gone or call.stalled:
            raise StopAsyncIteration  # the middleware records the hang-up (the body never ended)
        return self._rest.__anext__()

    async def aclose(self) -> None:
        await self._rest.aclose()  # type: ignore[attr-defined]


async def _ready(frame: bytes) -> bytes:
    return frame


async def stream_response(
    call: Call, frames: AsyncIterator[bytes], headers: dict[str, str] | None = None,
    rate_headers: Callable[[RateSnapshot], dict[str, str]] | None = None,
) -> Stream:
    """A `text/event-stream` response whose first frame is already there.

    Awaiting it here, before the response exists, lets a refusal (full queue, unknown
    model, upstream down, a consumer over its limit) still answer with its own status;
    `frames` raises it. The consumer's rate-limit state is known only then (the
    reservation is made on the way to the first frame): `rate_headers` renders it.
    """
    first = await frames.__anext__()
    call.stop_watching()  # from here Litestar watches for the hang-up
    body = call.body = StreamBody(first, frames, call)
    all_headers = _SSE_HEADERS if headers is None else {**_SSE_HEADERS, **headers}
    rate = call.record.rate
    if rate is not None and rate_headers is not None:
        all_headers = {**all_headers, **rate_headers(rate)}
    return Stream(body, media_type="text/event-stream", headers=all_headers)


def _usable_request_id(value: bytes | None) -> str | None:
    """A client's x-request-id when it is printable ASCII of at most 128 characters."""
    if value and len(value) <= 128 and value.isascii():
        text = value.decode("ascii")
        if text.isprintable():
            return text
    return None
