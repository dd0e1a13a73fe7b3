"""A tool call's arguments as an Anthropic `tool_use.input`, which must be a JSON object.

vLLM hands over `arguments` as a string, which need not be one (vLLM 0.32 answered a named
`tool_choice` with `4120000000000.0`). A non-streamed answer (`answers.encode_message`) and a
stream (`stream.AnthropicStream`, which holds a call until it is complete) decide with the
same function, so a request gets one verdict: the call's input, or the 502 below.
"""

from __future__ import annotations

import msgspec

from domain.errors import UpstreamProtocolError

NOT_AN_OBJECT = "The upstream produced tool call arguments that are not a JSON object."


def object_arguments(arguments: str) -> str | None:
    """A tool call's arguments as the JSON object text Anthropic's `input` must be: stripped,
    `""` for none (the input `{}`), None when they are not one JSON object (a number, `false`,
    a list, a string, text that is not JSON). Both ways of answering decide with this."""
    text = arguments.strip()
    if not text:
        return text
    if text[0] != "{":  # no decode for what cannot be an object
        return None
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return text if isinstance(value, dict) else None


_EMPTY_OBJECT = msgspec.Raw(b"{}")


def tool_input(arguments: str) -> msgspec.Raw:
    """A tool call's arguments as the JSON object Anthropic's `input` must be."""
    text = object_arguments(arguments)
    if text is None:
        raise UpstreamProtocolError(NOT_AN_OBJECT)
    return msgspec.Raw(text.encode()) if text else _EMPTY_OBJECT
