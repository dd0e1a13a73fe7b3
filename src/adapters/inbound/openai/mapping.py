"""OpenAI chat-completions requests -> canonical model: pure functions, no I/O (the answers'
way back: `answers`).

Decoding is as permissive as vLLM (`{"model": "m", "messages": []}` is a request) about
the members it models, and an allowlist about the rest: a member the gateway does not
model (`priority`, `request_id`, `kv_transfer_params`, `chat_template`, `cache_salt`, any
unknown one) is dropped, never forwarded (SECURITY.md). `stream_options.include_usage`
decides what the client sees; the upstream is always asked for usage.
"""

from __future__ import annotations

import re
from typing import Any, cast

import msgspec

from adapters.inbound._shared.limits import (
    InputLimits,
    check_choices,
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
from adapters.inbound._shared.sampling_params import decode_sampling, json_member
from adapters.inbound.openai import schema as w
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
from domain.errors import InvalidRequest
from domain.sampling import MAX_TEMPLATE_KWARGS, MAX_TEMPLATE_KWARGS_BYTES

_AT = re.compile(r" - at `(?:key` in `)?\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")


class OpenAIRequest(msgspec.Struct, kw_only=True):
    """A decoded request plus what only this surface needs (canonical has no slot for it)."""

    chat: ChatRequest
    include_usage: bool


def invalid(error: msgspec.ValidationError) -> InvalidRequest:
    """Turn msgspec's `... - at `$.messages[0].role`` into a message and a field path."""
    text = str(error)
    at = _AT.search(text)
    path = at.group(1).split("[...]")[0] if at else ""  # a dict member's path names the dict
    if at:
        text = text[: at.start()]
    missing = _MISSING.match(text)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return InvalidRequest(f"Missing required field `{path}`.", param=path)
    if not path:
        return InvalidRequest(f"Invalid request body: {text}.")
    return InvalidRequest(f"Invalid field `{path}`: {text}.", param=path)


_DEFAULT_LIMITS = InputLimits()


def decode_request(body: bytes, request_id: str = "", limits: InputLimits = _DEFAULT_LIMITS) -> OpenAIRequest:
    """Decode a chat-completions body; raises `InvalidRequest` naming the field.

    `limits` bounds the model name, the number of messages, the parts of each, image URLs,
    `max_tokens`, stop sequences and tools.
    """
    try:
        wire = w.REQUEST_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`") and " - at `" not in str(exc):
            raise InvalidRequest("The request body must be a JSON object.") from None
        raise invalid(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise deep_json() from None
    check_model(wire.model)  # before anything routes on it
    if len(wire.messages) > limits.max_messages:
        raise too_many_messages(len(wire.messages), limits.max_messages)
    most = limits.choices_for(wire.model)
    check_choices("n", wire.n, most, wire.model)
    check_choices("best_of", wire.best_of, most, wire.model)
    choice: ToolChoice | None = None
    if wire.tool_choice is not None:
        if isinstance(wire.tool_choice, str):
            choice = ToolChoice(mode=wire.tool_choice, parallel=wire.parallel_tool_calls)
        else:
            name = wire.tool_choice.function.name
            choice = ToolChoice(mode="named", name=name, parallel=wire.parallel_tool_calls)
    stop = _stop(wire.stop, limits)
    options = wire.stream_options
    max_tokens = _max_tokens(wire, limits.max_output_tokens.get(wire.model))
    # At most 15 keywords: CPython compiles a call with more to build a dict of them first (about
    # 7k instructions more per request); the members few clients send are set after, when sent.
    chat = ChatRequest(
        model=wire.model,
        messages=decode_messages(wire.messages, limits),
        max_tokens=max_tokens,
        temperature=wire.temperature,
        top_p=wire.top_p,
        stop=stop,
        stream=bool(wire.stream),
        tools=_tools(wire.tools or [], limits),
        tool_choice=choice,
        user=wire.user,
        affinity_key=wire.prompt_cache_key or wire.user or None,
        reasoning=_reasoning(wire),
        sampling=decode_sampling(wire, limits),
        surface="openai",
        request_id=request_id,
    )
    _set_rare_members(chat, wire)
    return OpenAIRequest(chat=chat, include_usage=bool(options and options.include_usage))


def _set_rare_members(chat: ChatRequest, wire: w.ChatCompletionRequest) -> None:
    """The members of `chat` most clients never send, set only when sent (see `decode_request`)."""
    if wire.top_k is not None:
        chat.top_k = wire.top_k
    if wire.n:
        chat.n = wire.n
    if wire.best_of is not None:
        chat.best_of = wire.best_of
    if wire.logprobs is not None:
        chat.logprobs = wire.logprobs
    if wire.top_logprobs is not None:
        chat.top_logprobs = wire.top_logprobs
    if wire.parallel_tool_calls is not None and chat.tool_choice is None:
        chat.parallel_tool_calls = wire.parallel_tool_calls
    if wire.chat_template_kwargs is not msgspec.UNSET:
        chat.chat_template_kwargs = template_kwargs(wire.chat_template_kwargs)
    options = wire.stream_options
    if options is not None and options.continuous_usage_stats is not None:
        chat.continuous_usage_stats = options.continuous_usage_stats


def _reasoning(wire: w.ChatCompletionRequest) -> ReasoningConfig | None:
    """vLLM's `reasoning_effort` and `thinking_token_budget` as the canonical reasoning config."""
    effort, budget = wire.reasoning_effort, wire.thinking_token_budget
    if effort is None and budget is None:
        return None
    if effort == "none":
        return ReasoningConfig(enabled=False, budget_tokens=budget)
    return ReasoningConfig(effort=effort, budget_tokens=budget)


def template_kwargs(raw: msgspec.Raw | msgspec.UnsetType) -> dict[str, Any] | None:
    """`chat_template_kwargs`: an object of at most MAX_TEMPLATE_KWARGS members and
    MAX_TEMPLATE_KWARGS_BYTES bytes (the chat template reads them; they cost nothing else)."""
    kwargs: dict[str, Any] | None = json_member(raw, "chat_template_kwargs", MAX_TEMPLATE_KWARGS_BYTES)
    if kwargs is not None and len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise InvalidRequest(f"`chat_template_kwargs` has {len(kwargs)} members; this gateway accepts at most "
                             f"{MAX_TEMPLATE_KWARGS}.", param="chat_template_kwargs")
    return kwargs


def _max_tokens(wire: w.ChatCompletionRequest, cap: int | None) -> int | None:
    """`max_completion_tokens` (vLLM's newer name) wins over `max_tokens`; both obey the
    upstream's cap, which is also the value when the request names none."""
    if cap is not None:
        for param in ("max_tokens", "max_completion_tokens"):
            value = getattr(wire, param)
            if value is not None and value > cap:
                raise too_many_tokens(value, cap, wire.model, param)
    chosen = wire.max_tokens if wire.max_completion_tokens is None else wire.max_completion_tokens
    return cap if chosen is None else chosen


def _stop(stop: str | list[str] | None, limits: InputLimits) -> list[str]:
    if isinstance(stop, str):
        check_stop([stop], limits.max_stop_sequences, "stop", lambda _: "stop")
        return [stop]
    check_stop(stop or [], limits.max_stop_sequences, "stop", lambda i: f"stop[{i}]")
    return stop or []


def _tools(tools: list[w.FunctionTool], limits: InputLimits) -> list[ToolSpec]:
    """The offered tools, each schema's size checked as received, then decoded."""
    if len(tools) > limits.max_tools:
        raise too_many_tools(len(tools), limits.max_tools)
    out: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        function = tool.function
        parameters: dict[str, Any] = {}
        if function.parameters is not msgspec.UNSET:
            raw, where = function.parameters, f"tools[{i}].function.parameters"
            if len(raw) > limits.max_tool_schema_bytes:
                raise tool_schema_too_large(len(raw), limits.max_tool_schema_bytes, where)
            parameters = _tool_schema(raw, where)
        out.append(ToolSpec(name=function.name, description=function.description, parameters=parameters))
    return out


def _tool_schema(raw: msgspec.Raw, where: str) -> dict[str, Any]:
    try:
        schema: dict[str, Any] | None = w.SCHEMA_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"Invalid field `{where}`: {exc}.", param=where) from None
    except RecursionError:
        raise deep_json() from None
    return schema or {}


def _parts(content: str | list[Any], keep_empty: bool = True, where: str = "",
           schemes: frozenset[str] = _DEFAULT_LIMITS.media_url_schemes) -> list[Part]:
    """Content parts; an image's URL must be one the model server may fetch (`where`: the
    message's path, to name a refused URL)."""
    if isinstance(content, str):
        return [TextPart(text=content)] if content or keep_empty else []
    out: list[Part] = []
    for j, part in enumerate(content):
        if type(part) is w.TextContent:
            out.append(TextPart(text=part.text))
        else:
            url = part.image_url.url
            check_media_url(url, f"{where}.content[{j}].image_url.url", schemes)
            out.append(ImagePart(url=url, detail=part.image_url.detail))
    return out


def decode_messages(messages: list[w.WireMessage], limits: InputLimits = _DEFAULT_LIMITS) -> list[Message]:
    """Wire messages -> canonical turns; consecutive tool results share one user turn.

    A message with more than `max_content_blocks` content parts (or tool calls) is refused,
    and so is an image URL the model server must not fetch.
    """
    max_parts = limits.max_content_blocks
    out: list[Message] = []
    tool_turn: Message | None = None
    for i, m in enumerate(messages):
        content = m.content
        if type(content) is list and len(content) > max_parts:
            raise too_many_blocks(len(content), max_parts, f"messages[{i}].content")
        if isinstance(m, w.ToolMessage):
            parts = cast("list[TextPart | ImagePart]", _parts(m.content))  # text parts only
            result = ToolResultPart(tool_use_id=m.tool_call_id, content=parts)
            if tool_turn is None:
                tool_turn = Message(role="user", content=[])
                out.append(tool_turn)
            tool_turn.content.append(result)
            continue
        tool_turn = None
        if isinstance(m, w.UserMessage):
            content_parts = _parts(m.content, where=f"messages[{i}]", schemes=limits.media_url_schemes)
            out.append(Message(role="user", content=content_parts, name=m.name))
        elif isinstance(m, w.AssistantMessage):
            if m.tool_calls is not None and len(m.tool_calls) > max_parts:
                raise too_many_blocks(len(m.tool_calls), max_parts, f"messages[{i}].tool_calls")
            out.append(_assistant(m))
        else:  # system or developer
            out.append(Message(role="system", content=_parts(m.content), name=m.name))
    return out


def _assistant(m: w.AssistantMessage) -> Message:
    content: list[Part] = []
    reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
    if reasoning:
        content.append(ThinkingPart(text=reasoning))
    if m.content is not None:
        content.extend(_parts(m.content, keep_empty=not m.tool_calls))
    for call in m.tool_calls or ():
        content.append(ToolUsePart(id=call.id, name=call.function.name, arguments=call.function.arguments))
    return Message(role="assistant", content=content, name=m.name)
