"""One streamed answer as an async iterator of `ChunkBatch`es: upstream reads -> SSE
payloads (`SseDecoder`) -> canonical chunks (`StreamMapper`), one batch per read.

With a heartbeat (`BodyReader`), a read that waited that long gives an empty batch (the
consumer's cue for a keep-alive) and the next one goes on waiting; nothing is lost.

The iterator ends at `[DONE]`: the consumer's stream must not wait for the end of the
upstream's body. That end (the last chunk of a chunked answer) is usually still in
flight; aiohttp gives the connection back to the session's pool by itself when it
arrives, so `close()` only arms a close for `_DONE_GRACE` later (a no-op by then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

import aiohttp

from domain.canonical import ChunkBatch, StreamChunk
from domain.errors import GatewayError, UpstreamProtocolError

from .sse_decoder import SseDecoder, SseOverflow, whole_events
from .stream_mapping import Phase, StreamMapper

_FAILED, _DONE = Phase.FAILED, Phase.DONE  # bound once: an Enum member lookup costs ~60 ns on Python 3.11
_DONE_GRACE = 1.0  # after [DONE], how long the body's end may take before the connection is closed


class Reader(Protocol):
    """The body's reads (`BodyReader`): `start()` gives the next bytes' awaitable (b"" at the
    body's end), each wait bounded; `reading` set False after it; `failure(exc)` is the domain
    error of an aiohttp error it raised; `beat()` whether a cancellation it raised was the
    heartbeat's; `close()` when the response is done."""

    reading: bool  # a read is pending: True from `start()` until its reader sets it False

    def start(self) -> Awaitable[bytes]: ...

    def beat(self) -> bool: ...

    def failure(self, exc: aiohttp.ClientError) -> GatewayError: ...

    def close(self) -> None: ...


class Mapper(Protocol):
    """Payloads -> canonical chunks: `StreamMapper` (chat) or `TextStreamMapper` (completions);
    `feed_events` maps a read of whole events (`sse_decoder.whole_events`), up to a failure;
    `token_read` a read of one token event, or None to leave the read to them."""

    phase: Phase

    @property
    def ended(self) -> bool: ...

    def feed(self, payload: bytes) -> StreamChunk | None: ...

    def token_read(self, data: bytes) -> ChunkBatch | None: ...

    def feed_events(self, data: bytes) -> ChunkBatch: ...

    def close(self) -> StreamChunk | None: ...

    def fail(self, error: GatewayError) -> StreamChunk | None: ...


class ChunkStream:
    """Async iterator of one response's chunks, one batch per upstream read; it ends at
    `[DONE]`. Mid-stream failures become a final `StreamError` chunk, never an exception:
    the client has already had its 200."""

    __slots__ = ("_decoder", "_eof", "_mapper", "_reader", "_resp")

    def __init__(self, resp: aiohttp.ClientResponse, reader: Reader, mapper: Mapper | None = None) -> None:
        self._resp = resp
        self._reader = reader
        self._decoder = SseDecoder()
        self._mapper: Mapper = mapper or StreamMapper()
        self._eof = False

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> ChunkBatch:
        mapper = self._mapper
        reader = self._reader
        while not self._eof:
            try:
                data = await reader.start()  # aiohttp's awaitable itself: one coroutine less per read
            except aiohttp.ClientError as exc:
                reader.reading = False
                batch = self._end([], mapper.fail(reader.failure(exc)))
            except asyncio.CancelledError:
                if reader.beat():
                    return []  # the heartbeat: nothing came for that long (the module doc)
                raise
            except BaseException:
                reader.reading = False
                raise
            else:
                reader.reading = False
                if not data:
                    batch = self._end([], mapper.close())
                else:
                    if not self._decoder.pending:
                        token = mapper.token_read(data)  # a paced stream's read: one token
                        if token is not None:
                            return token
                    batch = self._batch(data)
            if batch:
                return batch
        raise StopAsyncIteration

    def close(self) -> None:
        """Close the response (its connection, so the upstream aborts) unless the body
        ended; after `[DONE]`, only once the grace period is over (see the module doc)."""
        self._reader.close()
        resp = self._resp
        if self._mapper.phase is _DONE and not resp.content.is_eof():
            asyncio.get_running_loop().call_later(_DONE_GRACE, resp.close)
        else:
            resp.close()

    def _batch(self, data: bytes) -> ChunkBatch:
        """The chunks of one upstream read that is not one token of the learnt shape (`__anext__`
        looks for that first, without a call), maybe none; a failure as the last chunk. Once the
        mapper has ended (`[DONE]` or a failure), so has the stream."""
        mapper = self._mapper
        decoder = self._decoder
        if not decoder.pending:
            if whole_events(data):  # the usual read
                chunks = mapper.feed_events(data)
                if mapper.ended:
                    self._eof = True
                return chunks
        try:
            payloads = decoder.feed(data)
        except SseOverflow as exc:
            return self._end([], mapper.fail(UpstreamProtocolError(str(exc))))
        feed = mapper.feed
        batch: ChunkBatch = []
        for payload in payloads:
            chunk = feed(payload)
            if chunk is not None:
                batch.append(chunk)
                if mapper.phase is _FAILED:
                    break
        if mapper.ended:
            self._eof = True
        return batch

    def _end(self, batch: ChunkBatch, last: StreamChunk | None) -> ChunkBatch:
        self._eof = True
        if last is not None:
            batch.append(last)
        return batch
