"""Canonical stream events as single deltas: a `TextRun` (the texts of one read's token frames)
is the `TextDelta`s it stands for, so a test can compare streams however their reads fell."""

from __future__ import annotations

from collections.abc import Iterable

from domain.canonical import StreamChunk, StreamEvent, TextDelta, TextRun


def flat(events: Iterable[StreamEvent]) -> list[StreamEvent]:
    out: list[StreamEvent] = []
    for event in events:
        if type(event) is TextRun:
            out += [TextDelta(text=text) for text in event.texts]
        else:
            out.append(event)
    return out


def flat_events(chunks: Iterable[StreamChunk]) -> list[StreamEvent]:
    return flat(event for chunk in chunks for event in chunk.events)
