"""One request at the edge (`Call`): its id, its record, and the watch for its client's hang-up.

`edge.EdgeMiddleware` makes each request's `Call` and keeps it in the scope's state
(`CALL_KEY`); handlers and the edge checks find it with `call_of(request)`, the server's
protocol (`http_guard`) with `note_hang_up` / `note_stalled`. A dialect Router begins the
call's record once Litestar has routed the request to it (`Call.begin`).

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
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Protocol

from litestar import Request

from adapters.inbound._shared.limits import MAX_MODEL_CHARS
from application.consumer_limits import Door
from domain.consumers import ANONYMOUS_IDENTITY, Identity
from domain.records import RequestRecord
from ports.telemetry import RequestObserver

CALL_KEY = "gateway.call"  # in a scope's state: the request's `Call`
HANG_UP_NOTICE = "gateway.hang_up_notice"  # in a scope's state: the server calls `note_hang_up`
BODY_RECEIVED = "gateway.body_received"  # in a scope's state: the server has the whole request body
# The watcher task starts only once a request has run this long: a task, a wake-up and a
# cancellation per request cost more than a fast answer; a hang-up is noticed this late.
_WATCH_AFTER = 0.005
CLIENT_STALLED = "client_stalled"  # the record's error_kind of a client dropped for not reading


class Closable(Protocol):
    async def aclose(self) -> None: ...


class Call:
    """One request at the edge: its id, its record, and its hang-up watcher."""

    __slots__ = ("_cancelled", "_noticed", "_receive", "_t0", "_task", "_watcher", "_watching", "body", "door",
                 "gone", "handle", "header_bytes", "identity", "observer", "rate_headers", "record", "request_id",
                 "stalled", "started")  # fmt: skip

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
        # The consumer's rate-limit headers of a successful answer, encoded: the middleware sends
        # them after the answer's own headers (not through Litestar's `Response`, which would
        # lowercase and encode each name and value again).
        self.rate_headers: list[tuple[bytes, bytes]] | None = None
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
        if state is not None and state.get(CALL_KEY) is self:
            del state[CALL_KEY]
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
    call: Call = request.scope["state"][CALL_KEY]
    return call


def note_hang_up(scope: Any) -> None:
    """The server lost the connection of the request of `scope` before its response's end."""
    call: Call | None = (scope.get("state") or {}).get(CALL_KEY)
    if call is not None:
        call.hung_up()


def note_stalled(scope: Any) -> str | None:
    """Mark the request of `scope` as dropped for not reading; its request id, if it has one."""
    call: Call | None = (scope.get("state") or {}).get(CALL_KEY)
    if call is None:
        return None
    call.stalled = True
    return call.request_id


def _usable_request_id(value: bytes | None) -> str | None:
    """A client's x-request-id when it is printable ASCII of at most 128 characters."""
    if value and len(value) <= 128 and value.isascii():
        text = value.decode("ascii")
        if text.isprintable():
            return text
    return None
