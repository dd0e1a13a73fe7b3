"""Resuming a stream whose replica broke mid-answer on another replica (`domain.resume`).

For an upstream with `[endpoints]` and `resume = "tokens"` (docs/resume.md): a request that can
be resumed (`domain.resume.not_resumable`) is sent asking for token ids, which fill its
`TokenTrail`. When its stream breaks in a way another replica can mend (`trail.broken`), the
error chunk is held back, the lease moves to another replica with room (`SlotLease.move`: one
step in the ledger, memory or Redis, the cap never exceeded), and the rest of the answer is
asked of it as a continuation (`UpstreamClient.open_continuation`): the client sees one
unbroken stream. Where no other replica has room, the lease stays and the continuation is asked
of the replica that broke: it answers if only the connection broke, and if it is gone the call
fails at once and the resume looks for room again, for up to `wait` seconds (streams broken on
every replica at once must not wait for each other's slots). A stream that breaks before its
first payload (a server sends its head at once and its first chunk, with the prompt's ids, only
once the prompt is read) has given nobody anything: the request itself is sent again, as a
continuation of nothing. At most `max_resumes` times per
request; then, or when the request cannot be resumed, the error ends the stream as it would
have without resumes; a resume that finds no replica in time ends it with the last error.

Every break of a stream of such an upstream counts in `gateway_stream_resumes_total{upstream,
outcome}` (`domain.resume.OUTCOMES`); the request record gets `resumed` (continuations opened)
and `resumed_tokens` (ids sent again), and `endpoint` names the replica that finished it.
A client that hangs up during a resume cancels it like any other wait: the lease is released by
the caller's `finally`.

The services ask through `Resumes.open` (a stream) and `Resumes.answer` (a plain answer): for an
upstream that resumes they go through `relay`, otherwise straight through the `ReplicaCare`;
each service names only its own client methods and how a stream makes its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from application.replica_care import ReplicaCare
from domain.canonical import ChatRequest, ChunkBatch, Finish, StreamChunk, StreamError, Usage, UsageReport
from domain.completions import CompletionRequest
from domain.errors import GatewayError
from domain.reasoning import has_budget
from domain.records import RequestRecord
from domain.resume import FAILED, NOT_RESUMABLE, RESUMED, TokenTrail, not_resumable, remaining_tokens
from domain.upstream_failures import safe_to_retry
from ports.admission import SlotLease
from ports.upstream import CompletionClient, UpstreamClient

ResumeListener = Callable[[str, str], None]
"""Told (upstream, outcome) on each break of a stream of an upstream that resumes."""
Opener = Callable[..., AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]]
Continuation = Callable[[str | None], Opener | None]
"""Given the replica that broke, the opener of the continuation (`replica=` is the care's); None
when nothing is left to generate (`domain.resume.remaining_tokens`)."""
Opened = Callable[[], Awaitable[None]]
"""Awaited once the answer is being served (the first stream opened, or the plain call answered)."""
Continues = UpstreamClient | CompletionClient
"""The client a continuation is asked of (`open_continuation`, read only when one opens)."""
T = TypeVar("T")

MOVE_WAIT = 10.0  # seconds a resume keeps looking for a replica that takes its continuation
_RETRY_PAUSE = 0.25  # between two tries


class Resumes:
    """Which upstreams resume, how often per request (`limits`: upstream -> max_resumes), and
    the relay of a stream that may be resumed."""

    __slots__ = ("_limits", "_listeners", "_wait")

    def __init__(self, limits: Mapping[str, int] | None = None, listeners: Sequence[ResumeListener] = (),
                 wait: float = MOVE_WAIT) -> None:  # fmt: skip
        self._limits = dict(limits or {})
        self._listeners = list(listeners)
        self._wait = wait

    def trail(self, upstream: str, request: ChatRequest | CompletionRequest) -> TokenTrail | None:
        """A trail for a request this upstream could resume; None: sent as without resumes."""
        if upstream not in self._limits or not_resumable(request) is not None:
            return None
        return TokenTrail(budgeted=isinstance(request, ChatRequest) and has_budget(request))

    def watches(self, upstream: str) -> bool:
        return upstream in self._limits

    def open(
        self, care: ReplicaCare, upstream: str, request: ChatRequest | CompletionRequest, lease: SlotLease,
        record: RequestRecord | None, opener: Opener, client: Continues, opened: Opened | None = None,
        heartbeat: float | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """`request`'s stream: `opener(**kwargs)` (given `trail=` where the request can be resumed)
        relayed and resumed with `client.open_continuation` (with `heartbeat`) for an upstream
        that resumes, otherwise opened through `care` as it is; `opened` is awaited once it has
        opened."""
        if not self.watches(upstream):
            opening = care.open(upstream, lease, record, opener)
            return opening if opened is None else _then(opening, opened)
        return self._relayed(care, upstream, request, lease, record, opener, client, opened, heartbeat,
                             self.trail(upstream, request))  # fmt: skip

    async def answer(
        self, care: ReplicaCare, upstream: str, request: ChatRequest | CompletionRequest, lease: SlotLease,
        record: RequestRecord | None, call: Callable[..., Awaitable[T]], opener: Opener, client: Continues,
        collect: Callable[[AsyncIterator[ChunkBatch]], Awaitable[T]], opened: Opened | None = None,
    ) -> T:
        """`request`'s plain answer: `call(**kwargs)` through `care`, or, when it can be resumed,
        its stream (`open`) gathered by `collect` (`application.collected`): a break is then
        mended before the answer is whole. `opened` is awaited once it is being served."""
        trail = self.trail(upstream, request) if self.watches(upstream) else None
        if trail is None:
            answer = await care.call(upstream, lease, record, call)
            if opened is not None:  # where it was served (after a retry, too)
                await opened()
            return answer
        async with self._relayed(care, upstream, request, lease, record, opener, client, opened, None,
                                 trail) as batches:  # fmt: skip
            return await collect(batches)

    def _relayed(
        self, care: ReplicaCare, upstream: str, request: ChatRequest | CompletionRequest, lease: SlotLease,
        record: RequestRecord | None, opener: Opener, client: Continues, opened: Opened | None,
        heartbeat: float | None, trail: TokenTrail | None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """`relay` of `opener`'s stream (given `trail=` when there is one), closed on leaving."""
        if trail is not None:
            opener = functools.partial(opener, trail=trail)
        continuation = _continuation(client, request, trail, heartbeat)
        return contextlib.aclosing(self.relay(care, upstream, lease, record, opener, continuation, trail, opened))

    def _count(self, upstream: str, outcome: str) -> None:
        for listener in self._listeners:
            listener(upstream, outcome)

    async def relay(
        self, care: ReplicaCare, upstream: str, lease: SlotLease, record: RequestRecord | None, opener: Opener,
        continuation: Continuation, trail: TokenTrail | None, opened: Opened | None = None,
    ) -> AsyncGenerator[ChunkBatch, None]:
        """The batches of `opener`'s stream (opened through `care`), continued after a break
        (see the module doc); `opened` is awaited once the first stream has opened. Failures
        while the first stream opens are raised; once the client has its answer's head, a
        failure is a `StreamError` chunk."""
        first = True
        whole = opener  # the request itself: sent again when it broke before its first payload
        relayed = False  # a batch with chunks was passed on
        loop = asyncio.get_running_loop()
        until: float | None = None  # while a continuation is being opened: when to give up
        while True:
            held = False  # the batch that broke, its error chunk held back
            try:
                async with care.open(upstream, lease, record, opener) as batches:
                    if first:
                        if opened is not None:
                            await opened()
                    else:
                        until = None
                        self._count(upstream, RESUMED)
                    async for batch in batches:
                        if batch and _broken(batch, trail):
                            if self._may_resume(upstream, trail, not relayed and len(batch) == 1):
                                held = True
                                if len(batch) > 1:
                                    yield batch[:-1]
                                break
                            self._count(upstream, NOT_RESUMABLE)
                        relayed = relayed or bool(batch)
                        yield batch
            except GatewayError as error:
                if first:
                    raise
                if until is not None and safe_to_retry(error.failure) and loop.time() < until:
                    await asyncio.sleep(_RETRY_PAUSE)  # no replica took it yet: look for room again
                    await _place(lease)
                    continue
                self._count(upstream, FAILED)
                yield [_error_chunk(error)]
                return
            if not held:
                return
            assert trail is not None
            broken_at = lease.replica
            await _place(lease)
            trail.restart()
            following = whole if trail.prompt is None else continuation(broken_at)
            if following is None:  # it broke after its last token: only the finish was lost
                self._count(upstream, RESUMED)
                yield [_finished(trail)]
                return
            if record is not None:
                record.resumed += 1
                record.resumed_tokens += 0 if trail.prompt is None else len(trail.continuation_prompt())
            first, until, opener = False, loop.time() + self._wait, following

    def _may_resume(self, upstream: str, trail: TokenTrail | None, untouched: bool) -> bool:
        """A break another replica can mend, with resumes left: the trail allows a continuation,
        or the answer broke before its first payload (`untouched`: nothing was relayed of it)."""
        if trail is None or trail.broken is None or trail.resumes >= self._limits.get(upstream, 0):
            return False
        return trail.resumable_now() or (untouched and trail.prompt is None and not trail.generated)


def _continuation(client: Continues, request: ChatRequest | CompletionRequest, trail: TokenTrail | None,
                  heartbeat: float | None) -> Continuation:  # fmt: skip
    """The opener of a continuation of `request`'s answer, given the replica that broke."""

    def continuation(broken_at: str | None) -> Opener | None:
        assert trail is not None
        if remaining_tokens(request, trail) <= 0:
            return None
        return functools.partial(client.open_continuation, request, trail, heartbeat=heartbeat,
                                 resumed_from=broken_at)  # fmt: skip

    return continuation


@contextlib.asynccontextmanager
async def _then(opening: AbstractAsyncContextManager[AsyncIterator[ChunkBatch]],
                opened: Opened) -> AsyncIterator[AsyncIterator[ChunkBatch]]:  # fmt: skip
    """`opening` entered, then `opened` awaited inside it."""
    async with opening as batches:
        await opened()
        yield batches


async def _place(lease: SlotLease) -> None:
    """Move the lease to another replica with room; where none has (or the shared ledger cannot be
    reached), it stays: the continuation is asked of the replica that broke, which answers if
    only the connection broke and refuses at once if it is gone."""
    with contextlib.suppress(GatewayError):
        await lease.move()


def _broken(batch: ChunkBatch, trail: TokenTrail | None) -> bool:
    """The batch ends its stream with an error another replica might mend: one its trail marked,
    or (a stream without a trail) a 5xx."""
    if trail is not None:
        return trail.broken is not None
    events = batch[-1].events
    return bool(events) and isinstance(events[-1], StreamError) and events[-1].status >= 500


def _finished(trail: TokenTrail) -> StreamChunk:
    """The end of an answer that broke after its last token: cut at its limit, usage whole."""
    usage = Usage(input_tokens=len(trail.prompt or ()), output_tokens=trail.vouched)
    return StreamChunk(events=[Finish(reason="max_tokens"), UsageReport(usage=usage)])


def _error_chunk(error: GatewayError) -> StreamChunk:
    return StreamChunk(events=[StreamError(kind=error.kind, message=error.message, status=error.status)])
