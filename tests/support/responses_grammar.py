"""A checker of the Responses API streaming grammar, as the official SDKs consume it.

`check_responses_stream` takes the raw SSE bytes of one `/v1/responses` stream and
raises `GrammarError` on the first violation, then returns the parsed events:

- framing: `event: <name>` and one JSON `data:` line whose `type` is the name; comment
  lines (keep-alives) anywhere;
- every event validates, strictly, as openai-python's `ResponseStreamEvent` union: an
  event the SDK does not know, or one missing a required member, fails;
- `sequence_number` counts 0, 1, 2, ... with no gap;
- `response.created` first (status `queued` or `in_progress`), `response.queued` only
  right after a queued `response.created`, `response.in_progress` once before any item
  (a Response that fails while queued never ran: none), one Response id;
- output items added at output_index 0, 1, 2 ..., each done once after it was added,
  content parts and deltas only inside an open item of their kind, each `.done` text the
  concatenation of its deltas, function arguments joining to JSON;
- exactly one terminal event last: `response.completed` / `response.incomplete`
  (every added item done, the Response's `output` those items) or `error` followed by
  `response.failed`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, get_args

import pydantic
from openai.types.responses import ResponseStreamEvent

# The SDK's event models by their `type` (its union is discriminated on it).
SDK_EVENTS: dict[str, type[pydantic.BaseModel]] = {
    get_args(model.model_fields["type"].annotation)[0]: model
    for model in get_args(get_args(ResponseStreamEvent)[0])
}
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


class GrammarError(AssertionError):
    pass


@dataclass
class _Item:
    kind: str
    id: str | None
    done: bool = False
    parts: int = 0
    text: str = ""
    arguments: str = ""
    final: dict[str, Any] = field(default_factory=dict)


def parse_events(stream: bytes) -> list[dict[str, Any]]:
    text = stream.decode()
    if text and not text.endswith("\n\n"):
        raise GrammarError(f"stream does not end with a blank line: {text[-80:]!r}")
    events: list[dict[str, Any]] = []
    for frame in text.split("\n\n")[:-1]:
        lines = [line for line in frame.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            raise GrammarError(f"malformed frame: {frame!r}")
        name, data = lines[0][7:], json.loads(lines[1][6:])
        if data.get("type") != name:
            raise GrammarError(f"event {name!r} carries type {data.get('type')!r}")
        if "error" in data:  # openai-python raises APIError on any top-level `error` member
            raise GrammarError(f"event {name!r} has a top-level `error` member")
        events.append(data)
    return events


def check_responses_stream(stream: bytes) -> list[dict[str, Any]]:
    events = parse_events(stream)
    if not events:
        raise GrammarError("empty stream")
    for n, event in enumerate(events):
        model = SDK_EVENTS.get(event["type"])
        if model is None:
            raise GrammarError(f"event {n} ({event['type']}) is not an event the SDK knows")
        try:
            model.model_validate(event)
        except pydantic.ValidationError as error:
            raise GrammarError(f"event {n} ({event['type']}) is not an SDK event: {error}") from None
        if event["sequence_number"] != n:
            raise GrammarError(f"event {n} ({event['type']}) has sequence_number {event['sequence_number']}")
    _check_lifecycle(events)
    _check_items(events)
    return events


def _check_lifecycle(events: list[dict[str, Any]]) -> None:
    first = events[0]
    if first["type"] != "response.created" or first["response"]["status"] not in ("queued", "in_progress"):
        raise GrammarError(f"the stream starts with {first['type']} ({first.get('response', {}).get('status')})")
    ident = first["response"]["id"]
    names = [e["type"] for e in events]
    ran = names.count("response.in_progress")
    if ran > 1 or (ran == 0 and events[-1]["type"] != "response.failed"):
        raise GrammarError(f"response.in_progress sent {ran} times")
    if "response.output_item.added" in names and names.index("response.output_item.added") < names.index(
            "response.in_progress"):
        raise GrammarError("an output item before response.in_progress")
    if "response.queued" in names and (names.index("response.queued") != 1 or first["response"]["status"] != "queued"):
        raise GrammarError("response.queued must follow a queued response.created")
    for event in events:
        if "response" in event and event["response"]["id"] != ident:
            raise GrammarError(f"{event['type']} names another response")
    terminal = [e for e in events if e["type"] in TERMINAL]
    if len(terminal) != 1 or terminal[0] is not events[-1]:
        raise GrammarError(f"expected one terminal event, last; got {[e['type'] for e in terminal]}")
    if events[-1]["type"] == "response.failed" and events[-2]["type"] != "error":
        raise GrammarError("response.failed must follow an error event")
    status = {"response.completed": "completed", "response.incomplete": "incomplete", "response.failed": "failed"}
    if events[-1]["response"]["status"] != status[events[-1]["type"]]:
        raise GrammarError(f"{events[-1]['type']} with status {events[-1]['response']['status']}")


def _check_items(events: list[dict[str, Any]]) -> None:
    items: list[_Item] = []
    for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            if event["output_index"] != len(items):
                raise GrammarError(f"item added at {event['output_index']}, expected {len(items)}")
            items.append(_Item(event["item"]["type"], event["item"].get("id")))
            continue
        if "output_index" not in event:
            continue
        index = event["output_index"]
        if index >= len(items):
            raise GrammarError(f"{kind} for output_index {index} before its item was added")
        item = items[index]
        if item.done:
            raise GrammarError(f"{kind} for output_index {index} after its item was done")
        if "item_id" in event and event["item_id"] != item.id:
            raise GrammarError(f"{kind} names item {event['item_id']}, the item at {index} is {item.id}")
        _step(item, kind, event)
    if events[-1]["type"] != "response.failed":
        undone = [n for n, item in enumerate(items) if not item.done]
        if undone:
            raise GrammarError(f"items {undone} never done")
        output = events[-1]["response"]["output"]
        if output != [item.final for item in items]:
            raise GrammarError("the terminal Response's output is not the items that were done")


def _step(item: _Item, kind: str, event: dict[str, Any]) -> None:
    expected = {"message": "output_text", "reasoning": "reasoning_text"}.get(item.kind)
    if kind == "response.content_part.added":
        if event["part"]["type"] != expected or item.parts:
            raise GrammarError(f"content part {event['part']['type']} in a {item.kind} item")
        item.parts += 1
    elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
        if not item.parts or kind.split(".")[1] != expected:
            raise GrammarError(f"{kind} in a {item.kind} item without its part")
        item.text += event["delta"]
    elif kind in ("response.output_text.done", "response.reasoning_text.done", "response.content_part.done"):
        text = event["text"] if "text" in event else event["part"]["text"]
        if text != item.text:
            raise GrammarError(f"{kind} text {text!r} is not the deltas' {item.text!r}")
    elif kind == "response.function_call_arguments.delta":
        if item.kind != "function_call":
            raise GrammarError(f"arguments delta in a {item.kind} item")
        item.arguments += event["delta"]
    elif kind == "response.function_call_arguments.done":
        if event["arguments"] != item.arguments:
            raise GrammarError("arguments done differs from the deltas")
        if item.arguments:
            json.loads(item.arguments)
    elif kind == "response.output_item.done":
        final = event["item"]
        if final["type"] != item.kind or final.get("id") != item.id:
            raise GrammarError(f"item {item.id} done as another item")
        if item.kind == "function_call" and final["arguments"] != item.arguments:
            raise GrammarError("the done function call's arguments differ from the deltas")
        if item.kind in ("message", "reasoning") and final["content"][0]["text"] != item.text:
            raise GrammarError("the done item's text differs from the deltas")
        item.done, item.final = True, final
