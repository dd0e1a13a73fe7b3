"""Request and response bodies at the edge: a request body read within its timeout, and a
`text/event-stream` response whose first frame is awaited before the response exists."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar import Request
from litestar.exceptions import InternalServerException
from litestar.response import Stream

from adapters.deadline import Deadline
from adapters.inbound._shared.call import BODY_RECEIVED, Call, call_of
from domain.consumers import RateSnapshot
from domain.errors import GatewayError, RequestTimeout

# The content type Litestar would set for `media_type=text/event-stream` given first: it fills it
# in with `setdefault` on its header list, which decodes and lowercases every header already
# there twice and raises a KeyError when it is absent (see `json_answer`). No buffering by
# nginx or an ingress.
_SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache",
                "x-accel-buffering": "no"}


class ClientGone(GatewayError):
    """The client hung up before its request body arrived: nobody reads the answer."""

    status = 499
    kind = "client-gone"
    title = "Client closed the request"


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
    rate_headers: Callable[[RateSnapshot], list[tuple[bytes, bytes]]] | None = None,
) -> Stream:
    """A `text/event-stream` response whose first frame is already there.

    Awaiting it here, before the response exists, lets a refusal (full queue, unknown
    model, upstream down, a consumer over its limit) still answer with its own status;
    `frames` raises it. The consumer's rate-limit state is known only then (the
    reservation is made on the way to the first frame): `rate_headers` renders it, and the
    edge middleware sends them (`Call.rate_headers`).
    """
    first = await frames.__anext__()
    call.stop_watching()  # from here Litestar watches for the hang-up
    body = call.body = StreamBody(first, frames, call)
    rate = call.record.rate
    if rate is not None and rate_headers is not None:
        call.rate_headers = rate_headers(rate)
    return Stream(body, media_type="text/event-stream",
                  headers=_SSE_HEADERS if headers is None else {**_SSE_HEADERS, **headers})

