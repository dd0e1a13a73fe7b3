"""`OpenAICompatClient` (over aiohttp) against a scripted upstream (`scripted_upstream.py`):
answers and streams mapped to canonical ones, a read's chunks as one batch, heartbeats while
the upstream is quiet, and the prompt count it asks the upstream for."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tests.support.events import flat_events
from tests.unit.outbound.scripted_upstream import COMPLETION, Upstream, batches, collect, request, scripted_upstream

from adapters.outbound.openai_compat import OpenAICompatClient
from domain.canonical import (
    ChatRequest,
    Finish,
    StreamChunk,
    StreamError,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolUsePart,
)
from domain.errors import NotSupported


@pytest.fixture
async def up() -> AsyncIterator[Upstream]:
    async with scripted_upstream() as state:
        yield state


async def test_complete_maps_the_answer(up: Upstream) -> None:
    response = await up.client().complete(request("json"))
    assert response.content == [
        ThinkingPart(text="Need the weather."),
        TextPart(text="Let me check."),
        ToolUsePart(id="chatcmpl-tool-1", name="get_weather", arguments='{"city": "Paris"}'),
    ]
    assert (response.id, response.finish_reason) == ("chatcmpl-42", "tool_use")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (50, 20)
    assert response.native is not None and response.native.data == COMPLETION
    assert "stream" not in up.bodies[0]
    sent = up.headers[0]
    assert sent["accept-encoding"] == "identity"  # bytes are relayed as they come: never compressed
    assert "user-agent" not in sent and "cookie" not in sent


async def test_stream_yields_canonical_chunks(up: Upstream) -> None:
    chunks = await collect(up.client(), request("stream"))
    events = flat_events(chunks)
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert texts == [TextDelta(text="Hello"), TextDelta(text=" there"), TextDelta(text="!")]
    assert Finish(reason="end_turn") in events
    assert all(c.native is not None for c in chunks)
    assert up.bodies[0]["stream"] is True
    assert up.bodies[0]["stream_options"] == {"include_usage": True}


async def test_chunks_of_one_read_come_as_one_batch(up: Upstream) -> None:
    got = await batches(up.client(), request("burst"))
    assert len(got[0]) == 3  # the server's first write held three events
    assert all(batch for batch in got)  # never an empty batch


async def heartbeat_batches(c: OpenAICompatClient, req: ChatRequest, heartbeat: float) -> list[list[StreamChunk]]:
    async with c.open_stream(req, heartbeat=heartbeat) as reads:
        return [batch async for batch in reads]


async def test_a_heartbeat_is_an_empty_batch_while_the_upstream_is_quiet_and_nothing_is_lost(up: Upstream) -> None:
    c = up.client()
    got = await heartbeat_batches(c, request("slow"), 0.1)
    first_gap = next(i for i, batch in enumerate(got) if not batch)
    assert first_gap == 1  # the first frame, then heartbeats while the upstream is quiet
    assert 3 <= sum(1 for batch in got if not batch) <= 5  # one per 0.1 s of the half second
    chunks = [chunk for batch in got for chunk in batch]
    assert chunks == [chunk for batch in await batches(c, request("stream")) for chunk in batch]  # all of it


async def test_heartbeats_do_not_reset_the_idle_timeout(up: Upstream) -> None:
    got = await heartbeat_batches(up.client(idle_timeout=0.35), request("stall_mid"), 0.1)
    assert sum(1 for batch in got if not batch) >= 2
    [last] = got[-1][-1].events
    assert isinstance(last, StreamError) and last.kind == "upstream-timeout"


async def test_count_tokens(up: Upstream) -> None:
    c = up.client(up.url + "/")  # a trailing slash on the root
    assert await c.count_tokens(request("any")) == 7
    with pytest.raises(NotSupported):
        await c.count_tokens(request("no-tokenize"))
