"""Deterministic answers of the stub upstream: what a chat request is answered, before any bytes.

Pure (no I/O): ``build_answer`` decides an ``Answer``; ``stub.chat_wire`` writes it as vLLM's
JSON body or SSE frames.

Answer text: token ``i`` is ``WORDS[i % 16]`` ("alpha", "bravo", ... "papa", the
NATO alphabet), tokens joined by single spaces, so ``--tokens 4`` answers
``"alpha bravo charlie delta"``. Every word is a recognisable stop string: a request
with ``"stop": ["echo"]`` gets ``"alpha bravo charlie delta "`` with finish_reason
``"stop"`` and ``stop_reason: "echo"`` (as vLLM: the text is cut before the match).
``max_tokens``/``max_completion_tokens`` below ``--tokens`` cut the content at that many
tokens with finish_reason ``"length"``; they limit content tokens only, never reasoning.

Reasoning text (``--reasoning``): ``REASONING`` pieces, "Let me think about this."; a
request's ``thinking_token_budget`` N keeps the first N pieces (vLLM ends the thinking after
N tokens; 0: none; -1: unlimited). The end of thinking is a token of its own (``stub.tokens``),
counted in ``completion_tokens`` as vLLM counts ``</think>``. Without ``--reasoning`` a budget is
refused, as vLLM without ``--reasoning-parser`` refuses it (``stub.chat``).

Tool calls: ``stub.tools`` picks the tool and makes up its arguments. ``max_tokens`` below
the count of argument fragments a stream sends cuts them there with finish_reason
``"length"``, as vLLM cuts a call that runs out of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from stub.schema import MAX_MODEL_LEN, ChatRequest, message_texts, token_ids
from stub.tools import pick_tool, split_arguments, tool_arguments

# fmt: off
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
         "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa")
# fmt: on
REASONING = ("Let", " me", " think", " about", " this.")


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
    prompt_ids: tuple[int, ...] = ()  # the prompt's token ids (return_token_ids)
    think_end: bool = False  # the end-of-thinking token comes between reasoning and content
    fragments: tuple[str, ...] = ()  # a tool call's arguments as streamed, one token each


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
    prompt_ids = tuple(token_ids(message_texts(req.messages)))
    prompt_tokens, ended = len(prompt_ids), reasoning
    limit = req.max_completion_tokens if req.max_tokens is None else req.max_tokens
    room = max_model_len - prompt_tokens
    limit = room if limit is None or limit > room else limit
    if tool is not None:
        arguments, finish = tool_arguments(tool.function.parameters), "tool_calls"
        fragments = split_arguments(arguments)
        if limit is not None and limit < len(fragments):  # out of tokens mid-call
            fragments, finish = fragments[: max(limit, 0)], "length"
            arguments = "".join(fragments)
        used = len(thoughts) + int(ended) + len(fragments)
        return Answer(thoughts, (), tool.function.name, arguments, finish, None, prompt_tokens, used,
                      prompt_ids=prompt_ids, think_end=ended, fragments=tuple(fragments))
    finish = "stop"
    if limit is not None and limit < tokens:
        tokens, finish = max(limit, 0), "length"
    pieces, matched = content_pieces(tokens), None
    if req.stop:
        pieces, matched = _cut_at_stop(pieces, [req.stop] if isinstance(req.stop, str) else req.stop)
        if matched is not None:
            finish = "stop"
    used = len(thoughts) + int(ended) + len(pieces)
    return Answer(thoughts, pieces, None, "", finish, matched, prompt_tokens, used, prompt_ids=prompt_ids,
                  think_end=ended)
