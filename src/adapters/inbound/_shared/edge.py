"""The edge middleware: around the Litestar app, each request's `Call`, turn and record.

`EdgeMiddleware` wraps the Litestar app (around its routing and exception handling): it
makes each request's `Call` (request id, the record the observer gets: `call`) and stamps
`x-request-id` on the response, after an answer's rate-limit headers (`Call.rate_headers`).
A dialect Router begins the call's record once Litestar has routed the request to it
(`Call.begin`, the Router's `before_request`), and the middleware reports a begun record
once the last byte went out or the client left; requests no dialect took (health checks,
the OpenAPI document) report none.

Why around the app and not as each Router's middleware: Litestar puts a second
exception-handling layer between a route's middleware and its handler (so that the
middleware's send wrapper sees the error responses), one more coroutine on every message
sent, per token of a stream. Around the app, Litestar's own app-level exception handling
renders a dialect's errors (with the Router's handlers) inside this middleware's send.

A burst of new requests starts a few per turn of the event loop (`arrivals.ArrivalPacer`,
the first thing the middleware does), so the streams in flight keep getting their tokens.

At its end a request leaves no reference cycle: the middleware takes the `Call` out of
the scope's state and the `Call` drops the server's `receive`, the task and the body, so
the request's objects are freed at once (the ceiling's stack leaves none either).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from adapters.inbound._shared.arrivals import ArrivalPacer
from adapters.inbound._shared.call import CALL_KEY, CLIENT_STALLED, Call


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
        scope.setdefault("state", {})[CALL_KEY] = call
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
                extra = call.rate_headers  # a limited consumer's answer (`Call.rate_headers`)
                message["headers"] = ([*message.get("headers", ()), request_id] if extra is None
                                      else [*message.get("headers", ()), *extra, request_id])
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
