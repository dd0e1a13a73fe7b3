"""How long a prompt is, asked of the model server's own tokenizer.

vLLM counts a chat prompt in one call: `POST /tokenize` with the chat body (`{"model",
"messages", ...}`), answered `{"count": N, "max_model_len": M, "tokens": [...]}`; a text
prompt likewise with `{"model", "prompt"}`. llama.cpp's `llama-server` tokenizes only text,
`{"content": "..."}`, and answers `{"tokens": [...]}` without `count`: a chat body is answered
`{"tokens": []}`, a count of nothing. So an answer without `count` counts `tokens`, and an
empty `tokens` for a prompt is taken as llama-server's: the prompt its chat template makes
(`POST /apply-template`, the same chat body, answered `{"prompt": "..."}`) is tokenized the
way its chat calls tokenize it (`add_special`, special tokens parsed), three calls in all.

`recount` is the one place a failed call turns this into a count: a context-length refusal
whose prompt size is only a lower bound gets the size the same server (the same replica)
counts, within `timeout`; if that fails, the refusal keeps its bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

from domain.canonical import ChatRequest
from domain.completions import CompletionRequest
from domain.errors import ContextLengthExceeded, GatewayError, UpstreamProtocolError

from .context_errors import with_prompt_count
from .request_body import encode_tokenize
from .wire import TEMPLATE_DECODER, TOKENIZE_DECODER, TokenizeView

log = logging.getLogger("gateway.upstream")

TOKENIZE, APPLY_TEMPLATE = "/tokenize", "/apply-template"
# One call of a helper endpoint: (replica or None, path, JSON body) -> the answer's body.
Ask = Callable[[str | None, str, bytes], Awaitable[bytes]]

_ENCODER = msgspec.json.Encoder()


def _tokenized(raw: bytes) -> TokenizeView:
    try:
        answer = TOKENIZE_DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise UpstreamProtocolError(f"malformed /tokenize answer: {exc}") from None
    if answer.size() is None:
        raise UpstreamProtocolError("malformed /tokenize answer: neither `count` nor `tokens`")
    return answer


async def _count_text_llama(ask: Ask, text: str, replica: str | None) -> int:
    """llama-server's count of `text`, as its completion and chat calls tokenize a prompt."""
    body = _ENCODER.encode({"content": text, "add_special": True})
    return len(_tokenized(await ask(replica, TOKENIZE, body)).tokens or ())


async def count_chat(ask: Ask, request: ChatRequest, replica: str | None = None) -> int:
    """The chat request's prompt size, as the server's tokenizer counts it."""
    body = encode_tokenize(request)
    answer = _tokenized(await ask(replica, TOKENIZE, body))
    if answer.count is not None:
        return answer.count
    if answer.tokens:
        return len(answer.tokens)
    # `{"tokens": []}`: llama-server ignored the chat body; its template makes the prompt text.
    try:
        template = TEMPLATE_DECODER.decode(await ask(replica, APPLY_TEMPLATE, body))
    except msgspec.DecodeError as exc:
        raise UpstreamProtocolError(f"malformed /apply-template answer: {exc}") from None
    return await _count_text_llama(ask, template.prompt, replica)


async def count_text(ask: Ask, model: str, prompt: str, replica: str | None = None) -> int:
    """A text completion's prompt size, as the server's tokenizer counts it."""
    answer = _tokenized(await ask(replica, TOKENIZE, _ENCODER.encode({"model": model, "prompt": prompt})))
    if answer.count is not None or answer.tokens or not prompt:
        return answer.size() or 0
    return await _count_text_llama(ask, prompt, replica)


async def recount(
    ask: Ask, error: ContextLengthExceeded, request: ChatRequest | CompletionRequest, replica: str | None,
    timeout: float,
) -> ContextLengthExceeded:
    """`error` with its prompt's real size when it only had a lower bound, else `error` itself.

    Only a single text prompt without a suffix is counted for a text completion (with several,
    which one the refusal is about is not said).
    """
    if error.exact:
        return error
    try:
        async with asyncio.timeout(timeout):
            if isinstance(request, ChatRequest):
                count = await count_chat(ask, request, replica)
            elif len(request.prompt) == 1 and request.suffix is None:
                count = await count_text(ask, request.model, request.prompt[0], replica)
            else:
                return error
    except TimeoutError:
        log.warning("upstream /tokenize gave no count within %gs: the refusal keeps its lower bound", timeout)
        return error
    except GatewayError as exc:
        log.warning("upstream /tokenize gave no count (%s): the refusal keeps its lower bound", exc.message)
        return error
    return with_prompt_count(error, count)
