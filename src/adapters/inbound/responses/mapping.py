"""Responses wire <-> canonical: a request to a `ChatRequest`, an answer to a Response.

Pure functions, no I/O. The Response echoes the request the way the API does
(`instructions`, `metadata`, `tools`, `tool_choice`, `reasoning`, ...), names the model
the client asked for, and is stateless: `store` is accepted and ignored, while
`previous_response_id`, `conversation` and `background` (which need stored responses)
are a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

import msgspec

from adapters.inbound._shared.limits import InputLimits, check_raw_size, too_many_tokens
from adapters.inbound.responses import objects as o
from adapters.inbound.responses import schema as w
from adapters.inbound.responses.input_items import STATELESS, decode_input
from adapters.inbound.responses.tools import Toolset, decode_tool_choice, decode_tools
from adapters.inbound.responses.validation import decode_body
from domain.canonical import (
    ChatRequest,
    ChatResponse,
    FinishReason,
    ReasoningConfig,
    TextPart,
    ThinkingPart,
    ToolUsePart,
    Usage,
)
from domain.errors import InvalidRequest
from domain.sampling import Sampling

SURFACE = "responses"
# OpenAI's own bounds on `metadata`, which every Response echoes.
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
_DEFAULT_LIMITS = InputLimits()


class ResponsesCall(msgspec.Struct, kw_only=True):
    """A decoded request: the canonical one, plus what only this surface needs."""

    chat: ChatRequest
    tools: Toolset  # to give namespaced calls their namespace back
    template: o.ResponseObject  # the Response echoing the request, status `in_progress`, no output


def decode_request(
    body: bytes, request_id: str = "", limits: InputLimits = _DEFAULT_LIMITS, created_at: int = 0
) -> ResponsesCall:
    """Decode a `POST /v1/responses` body; raises `InvalidRequest` naming the field."""
    wire = decode_body(body)
    _stateless(wire)
    _check_metadata(wire.metadata)
    tools = decode_tools(wire.tools)
    choice, offered = decode_tool_choice(wire.tool_choice, wire.parallel_tool_calls, tools)
    chat = ChatRequest(
        model=wire.model,
        messages=decode_input(wire.input, wire.instructions, tools, limits),
        max_tokens=_max_tokens(wire, limits.max_output_tokens.get(wire.model)),
        temperature=wire.temperature,
        top_p=wire.top_p,
        stream=bool(wire.stream),
        tools=offered,
        tool_choice=choice,
        user=wire.user,
        affinity_key=wire.prompt_cache_key or wire.user or None,  # as /v1 chat's (Codex sends one per session)
        reasoning=_reasoning(wire.reasoning),
        sampling=Sampling(response_format=_response_format(wire.text, limits.max_tool_schema_bytes)),
        surface=SURFACE,
        request_id=request_id,
    )
    return ResponsesCall(chat=chat, tools=tools, template=_template(wire, request_id, created_at))


def _stateless(wire: w.RequestBody) -> None:
    if wire.previous_response_id is not None:
        raise InvalidRequest(f"`previous_response_id` cannot be resolved: {STATELESS}.",
                             param="previous_response_id")
    if wire.conversation is not None:
        raise InvalidRequest(f"`conversation` cannot be resolved: {STATELESS}.", param="conversation")
    if wire.background:
        raise InvalidRequest(f"`background` responses must be stored to be fetched later: {STATELESS}, "
                             "and stream or wait for the answer.", param="background")


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidRequest(f"`metadata` has {len(metadata)} keys; at most {MAX_METADATA_KEYS} are allowed.",
                             param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise InvalidRequest(f"`metadata` keys are at most {MAX_METADATA_KEY} characters and values at most "
                                 f"{MAX_METADATA_VALUE}.", param="metadata")


def _max_tokens(wire: w.RequestBody, cap: int | None) -> int | None:
    """`max_output_tokens` within the upstream's cap, which is also the value when none is asked."""
    value = wire.max_output_tokens
    if value is not None and value < 1:
        raise InvalidRequest("`max_output_tokens` must be at least 1.", param="max_output_tokens")
    if cap is not None and value is not None and value > cap:
        raise too_many_tokens(value, cap, wire.model, "max_output_tokens")
    return cap if value is None else value


def _reasoning(param: w.ReasoningParam | None) -> ReasoningConfig | None:
    if param is None or param.effort is None:
        return None  # `summary` alone changes nothing the model does
    if param.effort == "none":
        return ReasoningConfig(enabled=False)
    return ReasoningConfig(effort=param.effort)


def _response_format(text: w.TextParam | None, max_bytes: int) -> dict[str, Any] | None:
    """`text.format` as the chat `response_format` (structured output); its schema at most
    `max_bytes` encoded, like a tool's."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema is None:
        raise InvalidRequest("Missing required field `text.format.schema`.", param="text.format.schema")
    check_raw_size(msgspec.json.encode(fmt.schema), max_bytes, "text.format.schema")
    schema: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    if fmt.description is not None:
        schema["description"] = fmt.description
    return {"type": "json_schema", "json_schema": schema}


def _template(wire: w.RequestBody, request_id: str, created_at: int) -> o.ResponseObject:
    reasoning = wire.reasoning or w.ReasoningParam()
    fmt = wire.text.format if wire.text is not None and wire.text.format is not None else None
    return o.ResponseObject(
        id=f"resp_{request_id}",
        created_at=created_at,
        status="in_progress",
        instructions=wire.instructions,
        max_output_tokens=wire.max_output_tokens,
        metadata=wire.metadata or {},
        model=wire.model,
        parallel_tool_calls=wire.parallel_tool_calls is not False,
        prompt_cache_key=wire.prompt_cache_key,
        reasoning=o.ReasoningEcho(effort=reasoning.effort, summary=reasoning.summary),
        temperature=wire.temperature,
        text=o.TextEcho(format=msgspec.to_builtins(fmt)) if fmt is not None else o.TextEcho(),
        tool_choice=wire.tool_choice if wire.tool_choice is not None else "auto",
        tools=wire.tools or [],
        top_p=wire.top_p,
        user=wire.user,
    )


# --- answers --------------------------------------------------------------------------------


def item_id(prefix: str, template: o.ResponseObject, index: int) -> str:
    """`msg_…`, `fc_…`, `rs_…`: unique within the response (its id) and across responses."""
    return f"{prefix}_{template.id.removeprefix('resp_')}_{index}"


def outcome(reason: FinishReason) -> tuple[str, o.IncompleteDetails | None]:
    """A finish reason as the Response's status (and why it is incomplete)."""
    if reason == "max_tokens":
        return "incomplete", o.IncompleteDetails(reason="max_output_tokens")
    if reason == "content_filter":
        return "incomplete", o.IncompleteDetails(reason="content_filter")
    return "completed", None


def usage_out(usage: Usage) -> o.ResponseUsage:
    """OpenAI counts cached prompt tokens inside `input_tokens` and names them in
    `input_tokens_details.cached_tokens` (vLLM's prefix-cache hits, when it reports them)."""
    details = o.InputTokensDetails(cached_tokens=usage.cached_tokens or 0)
    return o.ResponseUsage(input_tokens=usage.input_tokens, input_tokens_details=details,
                           output_tokens=usage.output_tokens, total_tokens=usage.input_tokens + usage.output_tokens)


def function_call(template: o.ResponseObject, tools: Toolset, index: int, call_id: str, offered: str,
                  arguments: str, status: str) -> o.FunctionCallOut:
    name, namespace = tools.split(offered)
    return o.FunctionCallOut(id=item_id("fc", template, index), call_id=call_id, name=name, arguments=arguments,
                             status=status, namespace=msgspec.UNSET if namespace is None else namespace)


def encode_response(response: ChatResponse, call: ResponsesCall) -> bytes:
    """A canonical answer as a Response object naming the model the client asked for."""
    template = call.template
    status, incomplete = outcome(response.finish_reason)
    item_status = "incomplete" if status == "incomplete" else "completed"
    output: list[o.OutputItem] = []
    texts: list[str] = []

    def close_text() -> None:
        if texts:
            part = o.OutputTextPart(text="".join(texts))
            output.append(o.OutputMessage(id=item_id("msg", template, len(output)), status=item_status, content=[part]))
            texts.clear()

    for part in response.content:
        if type(part) is TextPart:
            texts.append(part.text)
            continue
        close_text()
        if type(part) is ThinkingPart and not part.redacted and part.text:
            content = [o.ReasoningTextPart(text=part.text)]
            output.append(o.ReasoningOut(id=item_id("rs", template, len(output)), content=content))
        elif type(part) is ToolUsePart:
            output.append(function_call(template, call.tools, len(output), part.id, part.name, part.arguments,
                                        item_status))
    close_text()
    answer = msgspec.structs.replace(template, status=status, incomplete_details=incomplete, output=output,
                                     usage=usage_out(response.usage))
    return o.encode(answer)
