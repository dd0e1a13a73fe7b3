"""Responses `input` (and `instructions`) -> canonical conversation turns.

- `instructions` and `system` / `developer` messages are system turns.
- `user` messages are user turns (text and images by URL).
- What the assistant produced comes back as several items: `reasoning`, an `assistant`
  message, `function_call`s. Consecutive ones form one assistant turn (reasoning text
  as a `ThinkingPart`, calls as `ToolUsePart`s with the client's `call_id`), as one
  chat-completions assistant message carries content, reasoning and tool calls.
- Consecutive `function_call_output`s form one user turn of tool results.
- `item_reference`, files and audio need state or inputs this gateway does not have: a
  400 naming the item. Any other item type is a 400 too (it names the supported ones).
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

from adapters.inbound._shared.limits import InputLimits, too_many_blocks, too_many_messages
from adapters.inbound.responses import schema as w
from adapters.inbound.responses.tools import Toolset
from adapters.inbound.responses.validation import invalid_at
from domain.canonical import ImagePart, Message, Part, Role, TextPart, ThinkingPart, ToolResultPart, ToolUsePart
from domain.errors import InvalidRequest

_ITEMS: dict[str, type[Any]] = {
    "message": w.MessageItem,
    "function_call": w.FunctionCallItem,
    "function_call_output": w.FunctionCallOutputItem,
    "reasoning": w.ReasoningItem,
    "item_reference": w.ItemReference,
}
_SUPPORTED = ", ".join(f"`{k}`" for k in _ITEMS if k != "item_reference")
STATELESS = "this gateway is stateless and stores no responses or items: send the full history in `input`"


def decode_input(
    raw: str | list[dict[str, Any]], instructions: str | None, tools: Toolset, limits: InputLimits
) -> list[Message]:
    out: list[Message] = []
    if instructions:
        out.append(Message(role="system", content=[TextPart(text=instructions)]))
    if isinstance(raw, str):
        out.append(Message(role="user", content=[TextPart(text=raw)]))
        return out
    if len(raw) > limits.max_messages:
        raise too_many_messages(len(raw), limits.max_messages, "input")
    assistant: Message | None = None  # the open assistant turn, if the last item was one
    results: Message | None = None  # the open turn of tool results
    for i, item in enumerate(raw):
        at = f"input[{i}]"
        decoded = _item(item, at)
        if isinstance(decoded, w.ItemReference):
            raise InvalidRequest(f"`{at}` is an item_reference, but {STATELESS}.", param=at)
        if isinstance(decoded, w.FunctionCallOutputItem):
            assistant = None
            if results is None:
                results = Message(role="user", content=[])
                out.append(results)
            results.content.append(_result(decoded, at, limits.max_content_blocks))
            continue
        results = None
        if isinstance(decoded, w.MessageItem) and decoded.role != "assistant":
            assistant = None
            role: Role = "user" if decoded.role == "user" else "system"
            out.append(Message(role=role, content=_content(decoded.content, at, limits.max_content_blocks)))
            continue
        if assistant is None:
            assistant = Message(role="assistant", content=[])
            out.append(assistant)
        parts = assistant.content
        if isinstance(decoded, w.MessageItem):
            parts.extend(_content(decoded.content, at, limits.max_content_blocks))
        elif isinstance(decoded, w.FunctionCallItem):
            name = tools.join(decoded.name, decoded.namespace)
            parts.append(ToolUsePart(id=decoded.call_id, name=name, arguments=decoded.arguments))
        else:
            text = _reasoning_text(decoded)
            if text:
                parts.append(ThinkingPart(text=text))
        if len(parts) > limits.max_content_blocks:
            raise too_many_blocks(len(parts), limits.max_content_blocks, at)
    return out


def _item(item: dict[str, Any], at: str) -> Any:
    kind = item.get("type", "message" if "role" in item else None)
    decoder = _ITEMS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        shown = "missing" if kind is None else repr(str(kind)[:64])
        raise InvalidRequest(f"`{at}.type` is {shown}; this gateway takes {_SUPPORTED} items.",
                             param=f"{at}.type")
    try:
        return msgspec.convert(item, decoder)
    except msgspec.ValidationError as error:
        raise invalid_at(error, at) from None


def _content(content: str | list[Any], at: str, limit: int, field: str = "content") -> list[Part]:
    if isinstance(content, str):
        return [TextPart(text=content)]
    if len(content) > limit:
        raise too_many_blocks(len(content), limit, f"{at}.{field}")
    out: list[Part] = []
    for j, part in enumerate(content):
        if isinstance(part, w.InputText | w.OutputText):
            out.append(TextPart(text=part.text))
        elif isinstance(part, w.Refusal):
            out.append(TextPart(text=part.refusal))
        elif isinstance(part, w.InputImage):
            out.append(_image(part, f"{at}.{field}[{j}]"))
        else:
            _unsupported(part, f"{at}.{field}[{j}]")
    return out


def _image(part: w.InputImage, at: str) -> ImagePart:
    if part.image_url is None:
        raise InvalidRequest(
            f"`{at}` names an image by `file_id`, which needs the Files API; send `image_url` "
            "(an https or data: URL).", param=f"{at}.image_url",
        )
    detail = part.detail if part.detail in ("low", "high") else None  # "auto" is the upstream's default
    return ImagePart(url=part.image_url, detail=detail)


def _unsupported(part: Any, at: str) -> None:
    kind = "a file" if isinstance(part, w.InputFile) else "audio"
    raise InvalidRequest(f"`{at}` is {kind}; this gateway takes text and images (by URL) only.", param=at)


def _result(item: w.FunctionCallOutputItem, at: str, limit: int) -> ToolResultPart:
    output = item.output
    if isinstance(output, str):
        return ToolResultPart(tool_use_id=item.call_id, content=[TextPart(text=output)])
    parts = _content(cast("list[Any]", output), at, limit, "output")
    return ToolResultPart(tool_use_id=item.call_id, content=cast("list[TextPart | ImagePart]", parts))


def _reasoning_text(item: w.ReasoningItem) -> str:
    """The reasoning's own text; a client that kept only the summary sends that back."""
    if item.content:
        return "".join(part.text for part in item.content)
    return "\n\n".join(part.text for part in item.summary)
