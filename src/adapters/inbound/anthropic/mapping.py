"""Anthropic requests -> canonical model: pure functions, no I/O (the answers' way back:
`answers`).

Validation follows the API: errors name the offending field with Anthropic's dotted
path (`messages.0.content.1.type`, see `validation`), so a client's own error display
stays useful. The input limits (messages, blocks, `max_tokens`) are checked here.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from adapters.inbound._shared.limits import (
    InputLimits,
    check_model,
    check_stop,
    deep_json,
    too_many_blocks,
    too_many_messages,
    too_many_tokens,
    too_many_tools,
    tool_schema_too_large,
)
from adapters.inbound._shared.media_urls import check_media_url
from adapters.inbound.anthropic import schema as w
from adapters.inbound.anthropic.validation import decode_body, invalid
from domain.canonical import (
    ChatRequest,
    ImagePart,
    Message,
    Part,
    ReasoningConfig,
    TextPart,
    ThinkingPart,
    ToolChoice,
    ToolResultPart,
    ToolSpec,
    ToolUsePart,
)

SURFACE = "anthropic"

_DEFAULT_LIMITS = InputLimits()


def decode_messages(body: bytes, request_id: str, limits: InputLimits = _DEFAULT_LIMITS) -> ChatRequest:
    """The body of `POST /v1/messages` as a canonical request; raises `InvalidRequest`."""
    return to_chat_request(decode_body(w.MESSAGES_DECODER, body), request_id, limits)


def decode_count_tokens(body: bytes, request_id: str, limits: InputLimits = _DEFAULT_LIMITS) -> ChatRequest:
    return to_chat_request(decode_body(w.COUNT_TOKENS_DECODER, body), request_id, limits)


def to_chat_request(params: w.CountTokensParams, request_id: str, limits: InputLimits = _DEFAULT_LIMITS) -> ChatRequest:
    """Checks the limits (model name, messages, blocks, image URLs, `max_tokens`, stop
    sequences, tools) while mapping."""
    check_model(params.model)  # before anything routes on it
    if len(params.messages) > limits.max_messages:
        raise too_many_messages(len(params.messages), limits.max_messages)
    messages = _conversation(params.system, params.messages, limits)
    tools = _tools(params.tools or [], limits)
    request = ChatRequest(
        model=params.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(params.tool_choice, tools),
        reasoning=_reasoning(params.thinking),
        prefill=messages[-1].role == "assistant",  # vLLM continues it only when told to
        surface=SURFACE,
        request_id=request_id,
    )
    if isinstance(params, w.MessagesParams):
        cap = limits.max_output_tokens.get(params.model)
        if cap is not None and params.max_tokens > cap:
            raise too_many_tokens(params.max_tokens, cap, params.model, "max_tokens")
        request.max_tokens = params.max_tokens
        request.stream = params.stream
        request.stop = params.stop_sequences or []
        check_stop(request.stop, limits.max_stop_sequences, "stop_sequences", lambda i: f"stop_sequences.{i}")
        request.temperature = params.temperature
        request.top_p = params.top_p
        request.top_k = params.top_k
        request.user = params.metadata.user_id if params.metadata else None
        request.affinity_key = request.user or None
    return request


def _conversation(
    system: str | list[w.TextBlock] | None, turns: list[w.MessageParam], limits: InputLimits
) -> list[Message]:
    """A leading system message, then the turns with consecutive same-role turns merged.

    `system` turns inside `messages` stay where they are (OpenAI-compatible upstreams take
    system messages anywhere); the first turn that is not a system turn must be a user turn.
    """
    max_blocks = limits.max_content_blocks
    out: list[Message] = []
    if type(system) is list and len(system) > max_blocks:
        raise too_many_blocks(len(system), max_blocks, "system")
    text = system if isinstance(system, str) else "\n\n".join(b.text for b in system or ())
    if text:
        out.append(Message(role="system", content=[TextPart(text=text)]))
    first = next((i for i, turn in enumerate(turns) if turn.role != "system"), None)
    if first is None:
        raise invalid("messages", 'The messages must include a "user" message, not only system messages.')
    if turns[first].role != "user":
        raise invalid(f"messages.{first}.role", 'The first non-system message must use the "user" role.')
    for i, turn in enumerate(turns):
        if type(turn.content) is list and len(turn.content) > max_blocks:
            raise too_many_blocks(len(turn.content), max_blocks, f"messages.{i}.content")
        parts = _parts(turn, i, limits)
        if out and out[-1].role == turn.role:
            out[-1].content.extend(parts)
        else:
            out.append(Message(role=turn.role, content=parts))
    return out


def _parts(turn: w.MessageParam, i: int, limits: InputLimits) -> list[Part]:
    if isinstance(turn.content, str):
        return [TextPart(text=turn.content)]
    assistant, user = turn.role == "assistant", turn.role == "user"
    parts: list[Part] = []
    for j, block in enumerate(turn.content):
        match block:
            case w.TextBlock():
                parts.append(TextPart(text=block.text))
            case w.ImageBlock() if assistant or user:
                parts.append(_image(block, f"messages.{i}.content.{j}", limits))
            case w.ToolUseBlock() if assistant:
                parts.append(_tool_use(block, i, j))
            case w.ToolResultBlock() if user:
                parts.append(_tool_result(block, f"messages.{i}.content.{j}", limits))
            case w.ThinkingBlock() if assistant:
                parts.append(ThinkingPart(text=block.thinking, signature=block.signature or None))
            case w.RedactedThinkingBlock() if assistant:
                # The opaque data rides in `signature`, which is never forwarded upstream.
                parts.append(ThinkingPart(text="", signature=block.data, redacted=True))
            case _:
                kind = msgspec.inspect.type_info(type(block)).tag  # type: ignore[attr-defined]
                raise invalid(
                    f"messages.{i}.content.{j}.type",
                    f"'{kind}' blocks are not allowed in {turn.role} messages.",
                )
    return parts


def _image(block: w.ImageBlock, where: str, limits: InputLimits) -> ImagePart:
    """An image as the URL the upstream gets; a `url` source must be one it may fetch."""
    source = block.source
    if isinstance(source, w.Base64Source):
        url = f"data:{source.media_type};base64,{source.data}"
        check_media_url(url, f"{where}.source", limits.media_url_schemes)  # `data` may be turned off
        return ImagePart(url=url)
    check_media_url(source.url, f"{where}.source.url", limits.media_url_schemes)
    return ImagePart(url=source.url)


def _tool_use(block: w.ToolUseBlock, i: int, j: int) -> ToolUsePart:
    arguments = bytes(block.input)
    if not arguments.startswith(b"{"):
        raise invalid(f"messages.{i}.content.{j}.input", "Input should be an object.")
    return ToolUsePart(id=block.id, name=block.name, arguments=arguments.decode())


def _tool_result(block: w.ToolResultBlock, where: str, limits: InputLimits) -> ToolResultPart:
    """A tool's result: its blocks are bounded like a message's (`max_content_blocks`)."""
    content = block.content
    if isinstance(content, str):
        parts: list[TextPart | ImagePart] = [TextPart(text=content)] if content else []
    else:
        if len(content) > limits.max_content_blocks:
            raise too_many_blocks(len(content), limits.max_content_blocks, f"{where}.content")
        parts = [
            TextPart(text=b.text) if isinstance(b, w.TextBlock) else _image(b, f"{where}.content.{k}", limits)
            for k, b in enumerate(content)
        ]
    return ToolResultPart(tool_use_id=block.tool_use_id, content=parts, is_error=bool(block.is_error))


def _tools(tools: list[w.Tool], limits: InputLimits) -> list[ToolSpec]:
    if len(tools) > limits.max_tools:
        raise too_many_tools(len(tools), limits.max_tools)
    return [_tool(tool, i, limits.max_tool_schema_bytes) for i, tool in enumerate(tools)]


def _tool(tool: w.Tool, i: int, max_schema_bytes: int) -> ToolSpec:
    if tool.type not in (None, "custom"):
        raise invalid(
            f"tools.{i}.type",
            f"Server tool '{tool.type}' is not supported by this gateway; "
            "declare a custom tool with an input_schema instead.",
        )
    where, raw = f"tools.{i}.input_schema", tool.input_schema
    if raw is msgspec.UNSET:
        raise invalid(where, "Field required")
    if len(raw) > max_schema_bytes:  # as received, before it is decoded
        raise tool_schema_too_large(len(raw), max_schema_bytes, where)
    try:
        schema = w.SCHEMA_DECODER.decode(raw)
    except msgspec.ValidationError as error:
        raise invalid(where, str(error)) from None
    except RecursionError:
        raise deep_json() from None
    if schema is None:
        raise invalid(where, "Field required")
    return ToolSpec(name=tool.name, description=tool.description, parameters=schema)


def _tool_choice(choice: w.ToolChoice | None, tools: Sequence[ToolSpec]) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, w.ToolChoiceNone):
        return ToolChoice(mode="none")
    parallel = False if choice.disable_parallel_tool_use else None
    if isinstance(choice, w.ToolChoiceAuto):
        return ToolChoice(mode="auto", parallel=parallel)
    if not tools:
        raise invalid("tool_choice.type", f"tool_choice '{choice.__struct_config__.tag}' requires tools.")
    if isinstance(choice, w.ToolChoiceAny):
        return ToolChoice(mode="required", parallel=parallel)
    if all(tool.name != choice.name for tool in tools):
        raise invalid("tool_choice.name", f"Tool '{choice.name}' is not in tools.")
    return ToolChoice(mode="named", name=choice.name, parallel=parallel)


def _reasoning(thinking: w.Thinking | None) -> ReasoningConfig | None:
    if thinking is None:
        return None
    if isinstance(thinking, w.ThinkingEnabled):
        return ReasoningConfig(enabled=True, budget_tokens=thinking.budget_tokens)
    return ReasoningConfig(enabled=isinstance(thinking, w.ThinkingAdaptive))
