"""The stub's text completions (`POST /v1/completions`): the answer, in vLLM 0.32's wire shapes.

Pure (no I/O): ``stub.generate`` serves it (admission, pacing, faults, the `--log` line).

- Prompts, as vLLM takes them: a string, a list of strings, a list of token ids, or a list of
  such lists (each prompt gets `n` choices). A text prompt's ids are its words'
  (``schema.token_ids``); a token prompt's are its own. `usage.prompt_tokens` counts them.
- Text: the chat answer's words ("alpha bravo ...", `--tokens` of them, content token i with
  id ``CONTENT_BASE + i``), cut by `max_tokens` (default 16, as vLLM) and by `stop`. With
  `suffix` (fill in the middle) the words run backwards from the end of the alphabet ("papa
  oscar november ..."): vLLM itself refuses `suffix` ("suffix is not currently supported"),
  servers that fill in the middle take it, and a test can tell the two answers apart. `echo`
  prepends the prompt (a token prompt's words cannot be spelled: nothing); `n` answers that
  many choices; `logprobs` adds vLLM's legacy logprobs object.
- A continuation: a token prompt ending with generated ids (``stub.tokens``) gets the rest of
  the answer those ids began, as raw text (the reasoning left and ``</think>`` with
  ``--reasoning``, then the content words left), `max_tokens` counting its tokens.
- ``return_token_ids``: a stream's first chunk of each choice has ``prompt_token_ids``, every
  chunk ``token_ids`` (its piece's id; the stub's separate finish chunk ``[]``); a body's
  choices have both, the whole answer's ids. Without it both members are there as ``null``,
  as vLLM writes them, but for a streamed `echo`: its first chunk has the prompt's ids, unasked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from stub.answers import WORDS
from stub.schema import encode, token_ids
from stub.tokens import CONTENT_BASE, Tail, Token, continuation, generated_tail

DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = True


class CompletionRequest(msgspec.Struct):
    model: str
    prompt: str | list[str | int | list[int]]  # a text, texts, token ids, lists of token ids
    suffix: str | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None


COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt of a request: what `echo` repeats, its token ids, and its generated tail."""

    text: str
    ids: list[int]
    tail: Tail


NO_TAIL = Tail()  # a text prompt's: nothing generated at its end


def prompts_of(req: CompletionRequest) -> list[Prompt]:
    """The request's prompts; raises ValueError (400) for an empty or mixed `prompt`."""
    raw = req.prompt
    if isinstance(raw, str):
        return [Prompt(raw, token_ids([raw]), NO_TAIL)]
    if raw and all(isinstance(p, str) for p in raw):
        return [Prompt(p, token_ids([p]), NO_TAIL) for p in raw if isinstance(p, str)]
    if raw and all(isinstance(p, int) for p in raw):
        lists = [[p for p in raw if isinstance(p, int)]]
    elif raw and all(isinstance(p, list) and p for p in raw):
        lists = [p for p in raw if isinstance(p, list)]
    else:
        raise ValueError("`prompt` must be a string, a list of strings, a list of token ids or a list of such lists, "
                         "not empty.")  # fmt: skip
    if any(i < 0 for ids in lists for i in ids):
        raise ValueError("Token ids in `prompt` must be non-negative integers.")
    return [Prompt("", ids, generated_tail(ids)) for ids in lists]


@dataclass(frozen=True, slots=True)
class Completion:
    """The answer to one prompt: its tokens (id, text), finish_reason and stop_reason."""

    tokens: list[Token]
    finish: str
    stop_reason: str | None


def complete(req: CompletionRequest, prompt: Prompt, tokens: int, reasoning: bool) -> Completion:
    """The deterministic answer to `prompt` (`tokens`: `--tokens`; `reasoning`: `--reasoning`)."""
    if prompt.tail.generated:
        seq = continuation(prompt.tail, tokens, reasoning)
    elif req.suffix is not None:  # fill in the middle: the words backwards (see the module doc)
        seq = [(CONTENT_BASE + i, ("" if i == 0 else " ") + WORDS[-1 - i % len(WORDS)]) for i in range(tokens)]
    else:
        seq = continuation(NO_TAIL, tokens, False)
    limit = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    finish = "stop"
    if len(seq) > limit:
        seq, finish = seq[: max(limit, 0)], "length"
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    text = "".join(piece for _, piece in seq)
    found = min(((text.find(s), s) for s in stops if s and s in text), default=None)
    if found is None:
        return Completion(seq, finish, None)
    cut, used, out = found[0], 0, []
    for token_id, piece in seq:  # cut before the match, as vLLM (the stop string excluded)
        if used + len(piece) >= cut:
            if cut > used:
                out.append((token_id, piece[: cut - used]))
            break
        out.append((token_id, piece))
        used += len(piece)
    return Completion(out, "stop", found[1])


def _logprobs(pieces: list[str], offset: int) -> dict[str, Any]:
    """vLLM's legacy completions logprobs: one entry per piece."""
    offsets, at = [], offset
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {"tokens": pieces, "token_logprobs": [-0.5] * len(pieces),
            "top_logprobs": [{piece: -0.5} for piece in pieces], "text_offset": offsets}  # fmt: skip


@dataclass(frozen=True, slots=True)
class CompletionWire:
    """A completion answer's bytes: `body` (non-stream), or a stream's SSE frames in parts:
    `opening` (echo frames), `steps` (the token frames of each step: one per choice that
    still has a token) and `closing` (finish frames, usage chunk if asked, ``[DONE]``)."""

    body: bytes | None
    opening: list[bytes]
    steps: list[list[bytes]]
    closing: list[bytes]


def render(req: CompletionRequest, prompts: list[Prompt], answers: list[Completion], rid: str, created: int,
           include_usage: bool) -> CompletionWire:  # fmt: skip
    """The answer on the wire; `answers[p]` answers `prompts[p]`, `req.n` choices each."""
    ids = bool(req.return_token_ids)
    indices = range(req.n * len(prompts))
    completion_tokens = sum(len(answers[i // req.n].tokens) for i in indices)
    prompt_tokens = sum(len(p.ids) for p in prompts)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip
    head: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": req.model}
    if not req.stream:
        choices = []
        for i in indices:
            prompt, answer = prompts[i // req.n], answers[i // req.n]
            pieces = [piece for _, piece in answer.tokens]
            logprobs = _logprobs(pieces, len(prompt.text) if req.echo else 0) if req.logprobs is not None else None
            choices.append({"index": i, "text": (prompt.text if req.echo else "") + "".join(pieces),
                            "logprobs": logprobs, "finish_reason": answer.finish, "stop_reason": answer.stop_reason,
                            "token_ids": [t for t, _ in answer.tokens] if ids else None, "prompt_logprobs": None,
                            "prompt_token_ids": prompt.ids if ids else None})  # fmt: skip
        return CompletionWire(encode({**head, "choices": choices, "usage": usage}), [], [], [])
    started: set[int] = set()  # the choices whose first chunk went out (it carries prompt_token_ids)

    def frame(i: int, text: str, token: list[int], logprobs: Any = None, finish: str | None = None,
              stop_reason: str | None = None) -> bytes:  # fmt: skip
        first = i not in started
        started.add(i)
        choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": stop_reason,
                  "prompt_token_ids": prompts[i // req.n].ids if (ids or req.echo) and first else None,
                  "token_ids": token if ids else None}  # fmt: skip
        return b"data: " + encode({**head, "choices": [choice]}) + b"\n\n"

    opening = [frame(i, prompts[i // req.n].text, []) for i in indices] if req.echo else []
    steps: list[list[bytes]] = []
    for step in range(max(len(a.tokens) for a in answers)):
        frames = []
        for i in indices:
            tokens = answers[i // req.n].tokens
            if step < len(tokens):
                token_id, piece = tokens[step]
                logprobs = _logprobs([piece], 0) if req.logprobs is not None else None
                frames.append(frame(i, piece, [token_id], logprobs))
        steps.append(frames)
    closing = [frame(i, "", [], None, answers[i // req.n].finish, answers[i // req.n].stop_reason) for i in indices]
    if include_usage:
        closing.append(b"data: " + encode({**head, "choices": [], "usage": usage}) + b"\n\n")
    closing.append(b"data: [DONE]\n\n")
    return CompletionWire(None, opening, steps, closing)
