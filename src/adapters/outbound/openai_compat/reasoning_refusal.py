"""vLLM's refusal of a thinking budget, on a plain answer and on a stream.

vLLM without `--reasoning-parser` (and `--reasoning-config`) refuses every request carrying
`thinking_token_budget`, in its engine's input check: before a token is generated. A plain
request gets a 400; a streamed one gets its 200 first (the stream is already out when the
engine is handed the request), then the error as its first frame and `[DONE]`. Wording of
vLLM 0.20 to 0.32: "thinking_token_budget is set but reasoning_config is not configured.
Please set --reasoning-parser and/or --reasoning-config to use thinking_token_budget." (before
0.32 the last sentence names only `--reasoning-config`).

Either way the refusal becomes `ThinkingBudgetRefused`, raised where the call opens, so the
application can send the request again without the budget before anything reached the client.
"""

from __future__ import annotations

from domain.canonical import ChunkBatch, StreamError
from domain.errors import ThinkingBudgetRefused

from .chunk_stream import ChunkStream

_REFUSAL = "thinking_token_budget is set but reasoning_config is not configured"
# Events a refused stream never has before its error (what the engine generated).
_NOT_GENERATED = ("message_start", "usage")


def refuses_budget(message: str) -> bool:
    """The upstream's error message is vLLM's refusal of a thinking budget."""
    return _REFUSAL in message


def refusal_in(batch: ChunkBatch) -> ThinkingBudgetRefused | None:
    """The refusal, when a stream's first batch is one: its error before anything generated."""
    for chunk in batch:
        for event in chunk.events:
            if isinstance(event, StreamError):
                return ThinkingBudgetRefused(event.message) if refuses_budget(event.message) else None
            if event.__struct_config__.tag not in _NOT_GENERATED:
                return None
    return None


class ReadAhead:
    """A stream whose first batch was read while it opened (to see a refusal in it): that
    batch, then the rest; `close()` closes the stream."""

    __slots__ = ("_first", "_stream")

    def __init__(self, first: ChunkBatch | None, stream: ChunkStream) -> None:
        self._first = first  # None: the stream had ended
        self._stream = stream

    def __aiter__(self) -> ReadAhead:
        return self

    async def __anext__(self) -> ChunkBatch:
        first = self._first
        if first is not None:
            self._first = None
            return first
        return await self._stream.__anext__()

    def close(self) -> None:
        self._stream.close()


async def read_ahead(stream: ChunkStream) -> ReadAhead:
    """Read the stream's first batch; raise `ThinkingBudgetRefused` if it is vLLM's refusal.

    A heartbeat (an empty batch: nothing for that long) ends the look: vLLM refuses at once."""
    try:
        first: ChunkBatch | None = await stream.__anext__()
    except StopAsyncIteration:
        first = None
    if first:
        refusal = refusal_in(first)
        if refusal is not None:
            raise refusal
    return ReadAhead(first, stream)
