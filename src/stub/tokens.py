"""The stub's token ids: what ``return_token_ids`` reports, and how a token-id prompt continues.

Pure (no I/O). Every id range is the stub's own, so a prompt's generated tail can be told
apart from its words:

- a prompt word: ``schema.token_ids`` (crc32 of the word mod 100000: always below 100000);
- content token ``i`` (``content_pieces(...)[i]``, ``WORDS[i % 16]`` with its leading space):
  ``CONTENT_BASE + i``;
- reasoning piece ``j`` (``REASONING[j]``, with ``--reasoning``): ``REASONING_BASE + j``;
- the end of thinking, between the reasoning and the content (with ``--reasoning``, even when
  a ``thinking_token_budget`` of 0 left no reasoning, as vLLM forces ``</think>`` then):
  ``THINK_END``; its text in a raw ``/v1/completions`` answer is ``</think>``, and a chat
  stream with ``return_token_ids`` sends it as vLLM's reasoning parser does, a chunk whose
  delta is ``{}``;
- argument fragment ``k`` of a tool call: ``TOOL_BASE + k`` (the chunk that opens the call,
  its name, stands for no token: the stub's usage never counted one for it).

A chunk carries as many ids as tokens it stands for: one per piece; the finish chunk
(``{}``, a separate chunk in the stub) carries none.

A continuation: a token-id prompt to ``/v1/completions`` whose tail is generated ids
(reasoning ids, then optionally ``THINK_END``, then content ids, each part possibly empty)
is what a gateway sends to resume a broken answer on another replica (vLLM's own way:
the prompt's ids plus the ids generated so far). The stub's answers do not depend on the
prompt's words, so it continues the same answer (``--tokens`` content words, reasoning
first with ``--reasoning``) from the next token on, as raw text.
"""

from __future__ import annotations

from dataclasses import dataclass

from stub.answers import REASONING, content_pieces

CONTENT_BASE = 100_000
REASONING_BASE = 200_000
THINK_END = 299_999
TOOL_BASE = 300_000
THINK_END_TEXT = "</think>"

Token = tuple[int, str]  # (id, raw text) of one generated token


def is_content(token_id: int) -> bool:
    return CONTENT_BASE <= token_id < REASONING_BASE


def is_reasoning(token_id: int) -> bool:
    return REASONING_BASE <= token_id < THINK_END


@dataclass(frozen=True, slots=True)
class Tail:
    """The generated ids at the end of a token-id prompt, counted by kind."""

    reasoning: int = 0
    ended: bool = False  # THINK_END is among them
    content: int = 0

    @property
    def generated(self) -> int:
        return self.reasoning + int(self.ended) + self.content


def generated_tail(ids: list[int]) -> Tail:
    """Count the trailing generated ids: reasoning ids, then THINK_END, then content ids."""
    end = len(ids)
    content = 0
    while end and is_content(ids[end - 1]):
        end, content = end - 1, content + 1
    ended = bool(end) and ids[end - 1] == THINK_END
    end -= int(ended)
    reasoning = 0
    while end and is_reasoning(ids[end - 1]):
        end, reasoning = end - 1, reasoning + 1
    return Tail(reasoning, ended, content)


def continuation(tail: Tail, tokens: int, reasoning: bool) -> list[Token]:
    """The rest of the answer after `tail` (all of it for an empty tail), one (id, text) per
    token: the reasoning pieces left and ``</think>`` (with ``--reasoning``, when the tail is
    still thinking), then the content pieces left of ``--tokens``."""
    out: list[Token] = []
    if reasoning and not tail.ended and not tail.content:
        out += [(REASONING_BASE + j, REASONING[j]) for j in range(tail.reasoning, len(REASONING))]
        out.append((THINK_END, THINK_END_TEXT))
    pieces = content_pieces(tokens)
    out += [(CONTENT_BASE + i, pieces[i]) for i in range(tail.content, tokens)]
    return out
