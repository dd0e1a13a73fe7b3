"""A plain (non-streaming) answer made of a stream's chunks.

A request that may be resumed is sent to the model server as a stream even when the client
asked for a plain answer: only a stream carries the token ids a resume needs, and a break is
then mended invisibly (`application.resume`). This gathers the stream into the answer the
client asked for; the stream's error, if it ended with one, is raised as the call's would be.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from domain.canonical import (
    ChatResponse,
    ChunkBatch,
    Finish,
    MessageStart,
    Part,
    StreamError,
    TextDelta,
    TextPart,
    TextRun,
    ThinkingDelta,
    ThinkingPart,
    Usage,
    UsageReport,
)
from domain.completions import Completion
from domain.errors import GatewayError, UpstreamProtocolError


class StreamFailed(GatewayError):
    """A stream's `StreamError`, raised: its kind, status and message as the stream had them."""

    def __init__(self, error: StreamError) -> None:
        super().__init__(error.message)
        self.kind = error.kind
        self.status = error.status


async def answer_of(batches: AsyncIterator[ChunkBatch]) -> ChatResponse:
    """The whole answer of a chat stream (thinking, then text; usage; finish)."""
    start: MessageStart | None = None
    thinking: list[str] = []
    text: list[str] = []
    finish: Finish | None = None
    usage = Usage()
    async for batch in batches:
        for chunk in batch:
            for event in chunk.events:
                if isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, TextRun):
                    text.extend(event.texts)
                elif isinstance(event, ThinkingDelta):
                    thinking.append(event.text)
                elif isinstance(event, MessageStart):
                    start = start or event
                elif isinstance(event, UsageReport):
                    usage = event.usage
                elif isinstance(event, Finish):
                    finish = event
                elif isinstance(event, StreamError):
                    raise StreamFailed(event)
    if start is None or finish is None:
        raise UpstreamProtocolError("upstream stream ended without a finish_reason")
    content: list[Part] = []
    if thinking:
        content.append(ThinkingPart(text="".join(thinking)))
    if text or not thinking:
        content.append(TextPart(text="".join(text)))
    return ChatResponse(id=start.id, model=start.model, created=start.created, content=content,
                        finish_reason=finish.reason, stop_sequence=finish.stop_sequence, usage=usage)  # fmt: skip


async def completion_of(batches: AsyncIterator[ChunkBatch]) -> Completion:
    """The whole answer of a text completion stream."""
    answer = await answer_of(batches)
    text = "".join(part.text for part in answer.content if isinstance(part, TextPart))
    return Completion(id=answer.id, model=answer.model, created=answer.created, text=text,
                      finish_reason=answer.finish_reason, usage=answer.usage)  # fmt: skip
