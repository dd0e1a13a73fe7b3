"""A streamed answer's tool calls, assembled from their deltas into canonical events.

A call starts (`ToolCallStart`) with the first delta that names it; arguments that come
before its name (vLLM always sends the name first; other servers may not) are held and
sent right after the start. A call without an id gets one from the message's id.
"""

from __future__ import annotations

from domain.canonical import StreamEvent, ToolArgsDelta, ToolCallStart

from .wire import ToolCallDelta


class ToolCallDeltas:
    """The tool calls of one stream; `len()` is how many have started."""

    __slots__ = ("_held_args", "_message_id", "_started")

    def __init__(self, message_id: str) -> None:
        self._message_id = message_id
        self._started: set[int] = set()  # indices of tool calls already started
        self._held_args: dict[int, str] = {}  # arguments seen before their call's name

    def __len__(self) -> int:
        return len(self._started)

    def add(self, call: ToolCallDelta, position: int, events: list[StreamEvent]) -> None:
        """Append the events of one delta (`position`: its place in the chunk's list, the
        call's index when the delta has none)."""
        index = call.index if call.index is not None else position
        function = call.function
        name = function.name if function is not None else None
        args = function.arguments if function is not None else None
        if index not in self._started:
            if not name:  # no name yet
                if args:
                    self._held_args[index] = self._held_args.get(index, "") + args
                return
            self._started.add(index)
            call_id = call.id or f"{self._message_id}-tool-{index}"
            events.append(ToolCallStart(index=index, id=call_id, name=name))
            held = self._held_args.pop(index, "")
            if held:
                events.append(ToolArgsDelta(index=index, json_fragment=held))
        if args:
            events.append(ToolArgsDelta(index=index, json_fragment=args))
