"""Wire schema of the requests the stub reads, vLLM's error envelope, and /tokenize.

Only the fields the stub uses are declared; like vLLM, unknown fields are ignored.
Decoders are built once at import (no per-request decoder, no stdlib json).
"""

from __future__ import annotations

import zlib
from typing import Any

import msgspec

MAX_MODEL_LEN = 8192  # vLLM's --max-model-len: the default of the stub's own


class Part(msgspec.Struct):
    """One content-array part; only text parts matter to the stub."""

    type: str = "text"
    text: str | None = None


class Message(msgspec.Struct):
    role: str = "user"
    content: str | list[Part] | None = None


class FunctionDef(msgspec.Struct):
    name: str
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct, kw_only=True):
    type: str = "function"
    function: FunctionDef


class NamedFunction(msgspec.Struct):
    name: str


class NamedChoice(msgspec.Struct, kw_only=True):
    type: str = "function"
    function: NamedFunction


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = True  # vLLM: true when the object is present


class ChatRequest(msgspec.Struct, kw_only=True):
    """The fields of an OpenAI chat request the stub reads; the rest is ignored like vLLM."""

    model: str
    messages: list[Message] = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | NamedChoice | None = None
    n: int | None = None  # choices: n sequences of the --max-num-seqs places
    best_of: int | None = None
    # vLLM's cap on reasoning tokens; -1 is "unlimited" (vLLM reads it as unset).
    thinking_token_budget: int | None = None
    return_token_ids: bool | None = None  # vLLM's: the prompt's and the answer's token ids (stub.tokens)

    @property
    def sequences(self) -> int:
        return max(self.n or 1, self.best_of or 1)


# vLLM 0.32's refusal of a thinking budget on a server without --reasoning-parser (its input
# processor checks it when the engine is handed the request: before any token is generated).
BUDGET_REFUSAL = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set "
    "--reasoning-parser and/or --reasoning-config to use thinking_token_budget."
)
BUDGET_INVALID = "`thinking_token_budget` must be a non-negative integer or -1 for unlimited."


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None


CHAT_DECODER = msgspec.json.Decoder(ChatRequest)
TOKENIZE_DECODER = msgspec.json.Decoder(TokenizeRequest)
encode = msgspec.json.encode


def error_body(code: int, message: str, param: str | None = None) -> bytes:
    """vLLM (>= 0.10.1) nested error envelope."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
    info = {"message": message, "type": kind.get(code, "Error"), "param": param, "code": code}
    return encode({"error": info})


def context_refusal(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> tuple[str, str | None]:
    """vLLM 0.32's refusal of a prompt that leaves no room for an output token: (message, param).

    Over the limit, vLLM stops tokenizing at max-model-len + 1 tokens, so its message gives
    that as a lower bound ("at least N input tokens"), however long the prompt is; its
    `/tokenize` gives the real count. A prompt of exactly max-model-len tokens is counted
    whole and refused by the engine's own check. The output size named is the request's
    `max_tokens` (0 without one).
    """
    if prompt_tokens == max_model_len:
        return (
            f"The decoder prompt (length {prompt_tokens}) plus the number of requested output tokens (at least 1) "
            f"is longer than the maximum model length of {max_model_len}. Make sure that `max_model_len` is no "
            "smaller than the number of text tokens (prompt + requested output tokens).",
            None,
        )
    seen, output = max_model_len + 1, max_tokens or 0
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested {output} output "
        f"tokens and your prompt contains at least {seen} input tokens, for a total of at least {seen + output} "
        "tokens. Please reduce the length of the input prompt or the number of requested output tokens. "
        f"(parameter=input_tokens, value={seen})",
        "input_tokens",
    )


def message_texts(messages: list[Message]) -> list[str]:
    """Text of every message: string content and content-array text parts."""
    out: list[str] = []
    for message in messages:
        if isinstance(message.content, str):
            out.append(message.content)
        elif message.content:
            out.extend(p.text for p in message.content if p.type == "text" and p.text)
    return out


USER_PREFIX = 32  # characters of the last user message on a --log line


def last_user_text(messages: list[Message]) -> str:
    """The text of the last user message ("" when there is none)."""
    for message in reversed(messages):
        if message.role == "user":
            return " ".join(message_texts([message]))
    return ""


def token_ids(texts: list[str]) -> list[int]:
    """Deterministic whitespace tokenisation: one id (crc32 mod 100000) per word."""
    return [zlib.crc32(word.encode()) % 100000 for text in texts for word in text.split()]


def tokenize_body(body: bytes, max_model_len: int = MAX_MODEL_LEN) -> bytes:
    """Answer of POST /tokenize (the whole prompt, counted to its end whatever its length);
    raises ValueError (-> 400) on a bad request."""
    req = TOKENIZE_DECODER.decode(body)
    if req.prompt is not None:
        ids = token_ids([req.prompt])
    elif req.messages is not None:
        ids = token_ids(message_texts(req.messages))
    else:
        raise ValueError("Either `prompt` or `messages` must be given.")
    return encode({"count": len(ids), "max_model_len": max_model_len, "tokens": ids})
