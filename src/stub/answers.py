"""Deterministic answers of the stub upstream: answer building and wire bytes.

Everything here is pure (no I/O) so that the HTTP layer only moves bytes.

Answer text: token ``i`` is ``WORDS[i % 16]`` ("alpha", "bravo", ... "papa", the
NATO alphabet), tokens joined by single spaces, so ``--tokens 4`` answers
``"alpha bravo charlie delta"``. Every word is a recognisable stop string: a request
with ``"stop": ["echo"]`` gets ``"alpha bravo charlie delta "`` with finish_reason
``"stop"`` and ``stop_reason: "echo"`` (as vLLM: the text is cut before the match).
``max_tokens``/``max_completion_tokens`` below ``--tokens`` cut the content at that many
tokens with finish_reason ``"length"``; they limit content tokens only, never reasoning.

Reasoning text (``--reasoning``): ``REASONING`` pieces, "Let me think about this."; a
request's ``thinking_token_budget`` N keeps the first N pieces (vLLM ends the thinking after
N tokens; 0: none; -1: unlimited). Without ``--reasoning`` a budget is refused, as vLLM
without ``--reasoning-parser`` refuses it (``stub.server``).

Tool calls: see ``pick_tool``; arguments are made up by ``tool_arguments``: a value of the
tool's parameters schema (``example_value``), so a schema that is not an object schema gives
arguments that are JSON but not an object (``{"const": 4120000000000.0}`` gives
``4120000000000.0``, what vLLM 0.32 answered a named ``tool_choice`` with), and
``"x-stub-arguments": TEXT`` in the schema gives TEXT verbatim (text that is not JSON at all,
or ``""``). A stream sends them in 2-3 fragments (``split_arguments``), as vLLM streams a
call's arguments over several chunks. ``max_tokens`` below the fragment count cuts them
there with finish_reason ``"length"``, as vLLM cuts a call that runs out of tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from stub.schema import MAX_MODEL_LEN, ChatRequest, NamedChoice, Tool, encode, message_texts, token_ids

# fmt: off
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
         "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa")
# fmt: on
REASONING = ("Let", " me", " think", " about", " this.")


def example_value(schema: Any, depth: int = 0) -> Any:
    """A value valid for a (simple) JSON schema: string "x", integer 1, enum's first, ..."""
    if not isinstance(schema, dict) or depth > 16:
        return "x"
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example_value(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        value = {name: example_value(sub, depth + 1) for name, sub in props.items()}
        for name in schema.get("required") or ():
            value.setdefault(name, "x")
        return value
    scalars = {"integer": 1, "number": 1.5, "boolean": True, "array": [], "null": None}
    return scalars.get(kind, "x") if isinstance(kind, str) else "x"


STUB_ARGUMENTS = "x-stub-arguments"  # a schema key: the call's arguments, verbatim


def tool_arguments(parameters: dict[str, Any] | None) -> str:
    """The arguments text of a call of a tool with these parameters (see the module doc)."""
    schema = parameters or {}
    verbatim = schema.get(STUB_ARGUMENTS)
    if isinstance(verbatim, str):
        return verbatim
    return encode(example_value(schema)).decode()


def _begins_with_use(text: str, name: str) -> bool:
    """True for "use <name>" at the very start (after blanks), name followed by a non-name char."""
    text = text.lstrip()
    if text[:4].lower() != "use " or not text[4:].startswith(name):
        return False
    rest = text[4 + len(name) : 5 + len(name)]
    return not rest or not (rest.isalnum() or rest in "_-.")


def pick_tool(req: ChatRequest) -> Tool | None:
    """The tool to call: forced by tool_choice, or named by a last user message "use <name>".

    Only this explicit form triggers a call: real prompts mention tool names all the time,
    and an agent client would loop if any mention produced a call. Raises ValueError (400).
    """
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise ValueError(f"Invalid `tool_choice` value: {choice!r}.")
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        return None
    if choice == "required":
        return req.tools[0]
    if isinstance(choice, NamedChoice):
        for tool in req.tools:
            if tool.function.name == choice.function.name:
                return tool
        raise ValueError(f"Tool {choice.function.name!r} in `tool_choice` is not in `tools`.")
    if choice == "none" or not req.messages or req.messages[-1].role != "user":
        return None
    texts = message_texts(req.messages[-1:])
    by_length = sorted(req.tools, key=lambda t: len(t.function.name), reverse=True)
    for text in texts:
        for tool in by_length:
            if tool.function.name and _begins_with_use(text, tool.function.name):
                return tool
    return None


@lru_cache(maxsize=64)
def content_pieces(count: int) -> tuple[str, ...]:
    """The answer text as streamed pieces: "alpha", " bravo", " charlie", ..."""
    return tuple(("" if i == 0 else " ") + WORDS[i % len(WORDS)] for i in range(count))


def _cut_at_stop(pieces: tuple[str, ...], stop: list[str]) -> tuple[tuple[str, ...], str | None]:
    """Cut the pieces before the earliest stop string, as vLLM does (stop string excluded)."""
    text = "".join(pieces)
    found = [(text.find(s), s) for s in stop if s and s in text]
    if not found:
        return pieces, None
    cut, matched = min(found)
    out: list[str] = []
    used = 0
    for piece in pieces:
        if used + len(piece) >= cut:
            if cut > used:
                out.append(piece[: cut - used])
            break
        out.append(piece)
        used += len(piece)
    return tuple(out), matched


@dataclass(frozen=True, slots=True)
class Answer:
    """What the stub answers to one chat request, independent of stream/non-stream."""

    reasoning: tuple[str, ...]
    content: tuple[str, ...]
    tool: str | None
    arguments: str
    finish_reason: str
    stop_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # --prefix-cache: reported as usage.prompt_tokens_details


def build_answer(req: ChatRequest, tokens: int, reasoning: bool, max_model_len: int = MAX_MODEL_LEN) -> Answer:
    """Decide the deterministic answer; raises ValueError for an invalid request (400).

    As in vLLM 0.32, a `max_tokens` larger than the room the prompt leaves under
    `max_model_len` is shortened to fit, not refused (the caller refuses a prompt that
    leaves no room at all)."""
    tool = pick_tool(req)
    thoughts: tuple[str, ...] = REASONING if reasoning else ()
    budget = req.thinking_token_budget
    if thoughts and budget is not None and budget >= 0:
        thoughts = thoughts[:budget]  # vLLM ends the thinking after that many tokens
    prompt_tokens = len(token_ids(message_texts(req.messages)))
    limit = req.max_completion_tokens if req.max_tokens is None else req.max_tokens
    room = max_model_len - prompt_tokens
    limit = room if limit is None or limit > room else limit
    if tool is not None:
        arguments, finish = tool_arguments(tool.function.parameters), "tool_calls"
        fragments = split_arguments(arguments)
        if limit is not None and limit < len(fragments):  # out of tokens mid-call
            fragments, finish = fragments[: max(limit, 0)], "length"
            arguments = "".join(fragments)
        used = len(thoughts) + len(fragments)
        return Answer(thoughts, (), tool.function.name, arguments, finish, None, prompt_tokens, used)
    finish = "stop"
    if limit is not None and limit < tokens:
        tokens, finish = max(limit, 0), "length"
    pieces, matched = content_pieces(tokens), None
    if req.stop:
        pieces, matched = _cut_at_stop(pieces, [req.stop] if isinstance(req.stop, str) else req.stop)
        if matched is not None:
            finish = "stop"
    return Answer(thoughts, pieces, None, "", finish, matched, prompt_tokens, len(thoughts) + len(pieces))


def split_arguments(arguments: str) -> list[str]:
    """Arguments JSON in 2-3 non-empty fragments, as a streaming tool parser emits them."""
    n = len(arguments)
    cuts = [0, n // 3, 2 * n // 3, n]
    return [arguments[a:b] for a, b in itertools.pairwise(cuts) if b > a]


def _usage(answer: Answer, n: int = 1) -> dict[str, Any]:
    p, c = answer.prompt_tokens, answer.completion_tokens * n
    usage: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if answer.cached_tokens is not None:  # as vLLM with --enable-prompt-tokens-details
        usage["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens}
    return usage


def completion_body(answer: Answer, rid: str, created: int, model: str, call_id: str, n: int = 1) -> bytes:
    """Non-streaming chat.completion JSON; `n` choices (the same answer, indices 0..n-1)."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(answer.content)}
    if answer.reasoning:
        message["reasoning"] = "".join(answer.reasoning)
    if answer.tool is not None:  # vLLM leaves `tool_calls` out of an answer without calls
        message["content"] = None
        function = {"name": answer.tool, "arguments": answer.arguments}
        message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": answer.finish_reason,
        "stop_reason": answer.stop_reason,
    }
    return encode(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{**choice, "index": i} for i in range(n)],
            "usage": _usage(answer, n),
        }
    )


_PIECES: dict[str, bytes] = {}


def _enc(piece: str) -> bytes:
    """JSON string of a piece, cached: the same words recur in every answer."""
    out = _PIECES.get(piece)
    if out is None:
        out = encode(piece)
        if len(_PIECES) < 4096:
            _PIECES[piece] = out
    return out


DONE_FRAME = b"data: [DONE]\n\n"


def stream_frames(
    answer: Answer, rid: str, created: int, model: str, call_id: str, include_usage: bool, n: int = 1
) -> list[bytes]:
    """SSE frames (``data: {chunk}\\n\\n``) of a streamed answer, in order."""
    opening, tokens, closing = stream_parts(answer, rid, created, model, call_id, include_usage, n)
    return [*opening, *tokens, *closing]


def stream_parts(
    answer: Answer, rid: str, created: int, model: str, call_id: str, include_usage: bool, n: int = 1
) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """A streamed answer's SSE frames, built from one template, in three parts.

    (the role chunk), (one frame per generated token: reasoning, content, tool call
    pieces), (the finish chunk, the usage chunk if asked, ``[DONE]``). vLLM writes a
    frame per engine step, so only the token frames are paced (``--chunk-delay``); the
    frames after the last token leave with it. With `n` choices every frame is sent once
    per choice index, in index order.
    """
    top = b'{"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s' % (
        rid.encode(),
        created,
        encode(model),
    )
    head = b"data: " + top + b',"choices":[{"index":0,"delta":'
    tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
    opening = [head + b'{"role":"assistant","content":""}' + tail]
    frames = [head + b'{"reasoning":' + _enc(p) + b"}" + tail for p in answer.reasoning]
    frames += [head + b'{"content":' + _enc(p) + b"}" + tail for p in answer.content]
    if answer.tool is not None:
        start = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": answer.tool, "arguments": ""},
        }
        frames.append(head + b'{"tool_calls":' + encode([start]) + b"}" + tail)
        for fragment in split_arguments(answer.arguments):
            delta = b'{"tool_calls":[{"index":0,"function":{"arguments":%s}}]}' % _enc(fragment)
            frames.append(head + delta + tail)
    closing = [
        head
        + b'{},"logprobs":null,"finish_reason":"%s","stop_reason":%s}]}\n\n'
        % (answer.finish_reason.encode(), encode(answer.stop_reason))
    ]
    if n > 1:
        opening, frames, closing = _per_choice(opening, n), _per_choice(frames, n), _per_choice(closing, n)
    if include_usage:
        closing.append(b"data: " + top + b',"choices":[],"usage":' + encode(_usage(answer, n)) + b"}\n\n")
    closing.append(DONE_FRAME)
    return opening, frames, closing


_CHOICE_0 = b'"choices":[{"index":0,'


def _per_choice(frames: list[bytes], n: int) -> list[bytes]:
    """Each choice-0 frame once per choice index 0..n-1."""
    return [frame.replace(_CHOICE_0, b'"choices":[{"index":%d,' % i, 1) for frame in frames for i in range(n)]
