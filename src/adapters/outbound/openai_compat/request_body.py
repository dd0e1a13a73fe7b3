"""Canonical `ChatRequest` -> the JSON body of vLLM's `/v1/chat/completions`.

Built as plain dicts and lists and encoded once by a module-level encoder: this
runs for every request, so no intermediate Structs and no stdlib json.

Choices made here (the canonical model leaves them open):
- Assistant `ThinkingPart`s are sent as the assistant message's `reasoning` field
  (what current vLLM reads on input); redacted ones are dropped, they hold no text.
  Chat templates that do not render past reasoning simply ignore the field.
- Tool results become `{"role":"tool"}` messages placed before the rest of their
  user turn. Tool messages carry text only, so images inside a tool result move to
  that user turn's content, where a vision model can still see them.
- `tool_choice` and `parallel_tool_calls` are only sent with a non-empty `tools`:
  vLLM rejects `tools: []` and a forcing `tool_choice` without tools.
- Reasoning config is model-specific: `chat_template_kwargs.enable_thinking` is the
  Qwen3-style switch, `thinking_token_budget` a newer vLLM field, `reasoning_effort`
  vLLM's level (`low`, `medium`, `high`: `minimal` and `xhigh` are sent as the nearest);
  servers or templates that do not know them ignore them.
- Nothing a client sent reaches the body unless the canonical request models it: the
  allowlisted sampling parameters (`domain.sampling`), `n` / `best_of`, logprobs, the
  chat template's kwargs (merged with the reasoning switch, which wins). `stream_options`
  is only sent with a stream (vLLM rejects it otherwise) and always asks for usage.
- `cache_salt` is the gateway's own, per consumer (`domain.cache_salt`); a prefill (an
  assistant message to continue) is vLLM's `continue_final_message` without a generation
  prompt.
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.canonical import (
    ChatRequest,
    ImagePart,
    Message,
    Part,
    TextPart,
    ThinkingPart,
    ToolChoice,
    ToolResultPart,
    ToolUsePart,
)

_ENCODER = msgspec.json.Encoder()

Json = dict[str, Any]

# vLLM's `reasoning_effort` takes three levels; the finer canonical ones go to the nearest.
_VLLM_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def encode_chat(request: ChatRequest, *, stream: bool | None = None, token_ids: bool = False) -> bytes:
    """The upstream body for a chat request; `stream` overrides `request.stream`; `token_ids` asks
    vLLM for the prompt's and the answer's token ids (`return_token_ids`, for a resume)."""
    body = chat_body(request, request.stream if stream is None else stream)
    if token_ids:
        body["return_token_ids"] = True
    return _ENCODER.encode(body)


def encode_tokenize(request: ChatRequest) -> bytes:
    """The body of vLLM's chat-style `POST /tokenize`: what shapes the prompt of the chat call
    (its messages, tools, chat template kwargs and a prefill's flags), so the count is the
    prompt's. llama.cpp's `/apply-template` reads the same body."""
    body: Json = {"model": request.model, "messages": map_messages(request.messages)}
    if request.tools:
        body["tools"] = [_tool(t.name, t.description, t.parameters) for t in request.tools]
    kwargs = _template_kwargs(request)
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    if request.prefill:
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    return _ENCODER.encode(body)


def _template_kwargs(request: ChatRequest) -> Json | None:
    """The chat template's kwargs: the client's, with the reasoning switch (which wins)."""
    reasoning = request.reasoning
    kwargs = request.chat_template_kwargs
    if reasoning is not None and reasoning.enabled is not None:
        kwargs = {**(kwargs or {}), "enable_thinking": reasoning.enabled}
    return kwargs


def chat_body(request: ChatRequest, stream: bool) -> Json:
    body: Json = {"model": request.model, "messages": map_messages(request.messages)}
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.top_k is not None:
        body["top_k"] = request.top_k
    if request.stop:
        body["stop"] = request.stop
    if request.tools:
        body["tools"] = [_tool(t.name, t.description, t.parameters) for t in request.tools]
        if request.tool_choice is not None:
            _set_tool_choice(body, request.tool_choice)
    if request.user is not None:
        body["user"] = request.user
    reasoning = request.reasoning
    kwargs = _template_kwargs(request)
    if reasoning is not None:
        if reasoning.budget_tokens is not None:
            body["thinking_token_budget"] = reasoning.budget_tokens
        if reasoning.effort is not None:
            body["reasoning_effort"] = _VLLM_EFFORT[reasoning.effort]
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    if stream:
        body["stream"] = True
        options: Json = {"include_usage": True}  # the gateway needs usage for every stream
        if request.continuous_usage_stats is not None:
            options["continuous_usage_stats"] = request.continuous_usage_stats
        body["stream_options"] = options
    _sequences_and_sampling(body, request)
    return body


def _sequences_and_sampling(body: Json, request: ChatRequest) -> None:
    if request.n != 1:
        body["n"] = request.n
    if request.best_of is not None:
        body["best_of"] = request.best_of
    if request.logprobs is not None:
        body["logprobs"] = request.logprobs
    if request.top_logprobs is not None:
        body["top_logprobs"] = request.top_logprobs
    if request.tools and request.parallel_tool_calls is not None and "parallel_tool_calls" not in body:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    for name, value in request.sampling.fields():
        body[name] = value
    if request.prefill:
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt


def map_messages(messages: list[Message]) -> list[Json]:
    out: list[Json] = []
    for message in messages:
        role = message.role
        if role == "assistant":
            out.append(_assistant(message))
        elif role == "user":
            _user(message, out)
        else:
            text = "\n\n".join(p.text for p in message.content if isinstance(p, TextPart))
            out.append(_named({"role": role, "content": text}, message))
    return out


def _named(entry: Json, message: Message) -> Json:
    if message.name is not None:
        entry["name"] = message.name
    return entry


def _user(message: Message, out: list[Json]) -> None:
    parts = message.content
    if len(parts) == 1 and isinstance(parts[0], TextPart):  # the common case
        out.append(_named({"role": "user", "content": parts[0].text}, message))
        return
    rest: list[Part] = []
    results = False
    for part in parts:
        if isinstance(part, ToolResultPart):
            out.append(_tool_message(part, rest))
            results = True
        elif isinstance(part, (TextPart, ImagePart)):
            rest.append(part)
    if rest or not results:  # a turn of only tool results needs no user message
        out.append(_named({"role": "user", "content": _content(rest) if rest else ""}, message))


def _tool_message(part: ToolResultPart, spill: list[Part]) -> Json:
    texts: list[str] = []
    for item in part.content:
        if isinstance(item, TextPart):
            texts.append(item.text)
        else:
            spill.append(item)
    text = "\n".join(texts)
    if part.is_error:
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": part.tool_use_id, "content": text}


def _assistant(message: Message) -> Json:
    entry: Json = {"role": "assistant"}
    texts: list[Part] = []
    calls: list[Json] = []
    thoughts: list[str] = []
    for part in message.content:
        if isinstance(part, TextPart):
            texts.append(part)
        elif isinstance(part, ToolUsePart):
            calls.append(
                {
                    "id": part.id,
                    "type": "function",
                    "function": {"name": part.name, "arguments": part.arguments},
                }
            )
        elif isinstance(part, ThinkingPart) and not part.redacted and part.text:
            thoughts.append(part.text)
    if texts or not calls:
        entry["content"] = _content(texts) if texts else ""
    if calls:
        entry["tool_calls"] = calls
    if thoughts:
        entry["reasoning"] = "\n\n".join(thoughts)
    return _named(entry, message)


def _content(parts: list[Part]) -> str | list[Json]:
    """One text part as a plain string (what every chat template handles); else parts."""
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    out: list[Json] = []
    for part in parts:
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            image: Json = {"url": part.url}
            if part.detail is not None:
                image["detail"] = part.detail
            out.append({"type": "image_url", "image_url": image})
    return out


def _tool(name: str, description: str | None, parameters: dict[str, Any]) -> Json:
    function: Json = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def _set_tool_choice(body: Json, choice: ToolChoice) -> None:
    if choice.mode == "named" and choice.name is not None:
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice.mode != "named":
        body["tool_choice"] = choice.mode
    if choice.parallel is not None:
        body["parallel_tool_calls"] = choice.parallel
