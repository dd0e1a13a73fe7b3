"""Text completions and embeddings: wire <-> canonical, pure functions, no I/O.

A request becomes a `CompletionRequest` / `EmbeddingRequest` (every field it models, and
nothing else: an allowlist); an answer is the upstream's own bytes when the upstream speaks
this format (renamed to the model the client asked for), else encoded from the canonical one.

Sequences: a request asks the upstream for `max(n, best_of)` sequences per prompt; `n` and
`best_of` above the upstream's `max_choices` (`[upstreams.NAME] max_choices`, default 1)
are a 400 naming the field, and the request takes one slot of the cap per sequence
(`domain.sequences`). Prompts are bounded like messages (`max_messages`).
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from adapters.inbound._shared.limits import InputLimits, check_choices, check_model, deep_json, too_many_tokens
from adapters.inbound._shared.sampling_params import decode_sampling
from adapters.inbound.openai import completions_schema as w
from adapters.inbound.openai.answers import FINISH_REASONS, renamed, usage_out
from adapters.inbound.openai.mapping import invalid
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.errors import InvalidRequest

COMPLETION_FORMAT = "openai-completion"
EMBEDDINGS_FORMAT = "openai-embeddings"
TOKEN_IDS = "must be text: a string or a list of strings (token-id {what} are not accepted)"
_DEFAULT_LIMITS = InputLimits()
T = TypeVar("T")


class CompletionCall(msgspec.Struct, kw_only=True):
    request: CompletionRequest
    include_usage: bool  # whether the client sees the usage chunk of a stream


def _decode(decoder: msgspec.json.Decoder[T], body: bytes, text_field: str, what: str) -> T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`") and " - at `" not in str(exc):
            raise InvalidRequest("The request body must be a JSON object.") from None
        error = invalid(exc)
        if error.param is not None and error.param.startswith(text_field):
            raise InvalidRequest(f"`{text_field}` {TOKEN_IDS.format(what=what)}.", param=text_field) from None
        raise error from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise deep_json() from None


def decode_completion(body: bytes, request_id: str = "", limits: InputLimits = _DEFAULT_LIMITS) -> CompletionCall:
    """A `POST /v1/completions` body; raises `InvalidRequest` naming the field."""
    wire = _decode(w.COMPLETION_DECODER, body, "prompt", "prompts")
    prompts = [wire.prompt] if isinstance(wire.prompt, str) else wire.prompt
    if not prompts:
        raise InvalidRequest("`prompt` must not be empty.", param="prompt")
    check_model(wire.model)
    most = limits.choices_for(wire.model)
    check_choices("n", wire.n, most, wire.model)
    check_choices("best_of", wire.best_of, most, wire.model)
    if len(prompts) > limits.max_messages:  # each prompt is a sequence of its own upstream
        raise InvalidRequest(f"`prompt` holds {len(prompts)} prompts; this gateway accepts at most "
                             f"{limits.max_messages}.", param="prompt")
    if wire.logprobs is not None and wire.logprobs < 0:
        raise InvalidRequest("`logprobs` must be at least 0.", param="logprobs")
    cap = limits.max_output_tokens.get(wire.model)
    if wire.max_tokens is not None and wire.max_tokens < 0:
        raise InvalidRequest("`max_tokens` must be at least 0.", param="max_tokens")
    if cap is not None and wire.max_tokens is not None and wire.max_tokens > cap:
        raise too_many_tokens(wire.max_tokens, cap, wire.model, "max_tokens")
    stop = wire.stop
    # At most 15 keywords (see `mapping.decode_request`); the members few clients send after, when sent.
    request = CompletionRequest(
        model=wire.model, prompt=prompts, max_tokens=cap if wire.max_tokens is None else wire.max_tokens,
        temperature=wire.temperature, top_p=wire.top_p, stop=[stop] if isinstance(stop, str) else (stop or []),
        n=wire.n or 1, sampling=decode_sampling(wire, limits), user=wire.user,
        stream=bool(wire.stream), surface="openai", request_id=request_id,
    )
    if wire.suffix is not None:
        request.suffix = wire.suffix
    if wire.best_of is not None:
        request.best_of = wire.best_of
    if wire.echo:
        request.echo = True
    if wire.logprobs is not None:
        request.logprobs = wire.logprobs
    if wire.top_k is not None:
        request.top_k = wire.top_k
    options = wire.stream_options
    return CompletionCall(request=request, include_usage=bool(options and options.include_usage))


def decode_embeddings(body: bytes, request_id: str = "", limits: InputLimits = _DEFAULT_LIMITS) -> EmbeddingRequest:
    """A `POST /v1/embeddings` body; raises `InvalidRequest` naming the field."""
    wire = _decode(w.EMBEDDING_DECODER, body, "input", "inputs")
    inputs = [wire.input] if isinstance(wire.input, str) else wire.input
    if not inputs:
        raise InvalidRequest("`input` must not be empty.", param="input")
    if len(inputs) > limits.max_messages:
        raise InvalidRequest(f"`input` has {len(inputs)} inputs; this gateway accepts at most {limits.max_messages}.",
                             param="input")
    if wire.dimensions is not None and wire.dimensions < 1:
        raise InvalidRequest("`dimensions` must be at least 1.", param="dimensions")
    return EmbeddingRequest(model=wire.model, inputs=inputs, dimensions=wire.dimensions,
                            encoding_format=wire.encoding_format, user=wire.user, surface="openai",
                            request_id=request_id)


def completion_body(answer: Completion, model: str) -> bytes:
    """The `text_completion` naming `model` (the client's): the upstream's bytes when they are
    in this format, else encoded from the canonical answer."""
    native = answer.native
    if native is not None and native.format == COMPLETION_FORMAT:
        return native.data if answer.model == model else renamed(native.data, model)
    choice = w.CompletionChoice(text=answer.text, finish_reason=FINISH_REASONS.get(answer.finish_reason, "stop"))
    return w.encode(w.TextCompletion(id=answer.id, created=answer.created, model=model, choices=[choice],
                                     usage=usage_out(answer.usage)))


def embeddings_body(answer: Embeddings, model: str) -> bytes:
    native = answer.native
    if native is not None and native.format == EMBEDDINGS_FORMAT:
        return native.data if answer.model == model else renamed(native.data, model)
    data = [w.EmbeddingData(index=i, embedding=vector) for i, vector in enumerate(answer.vectors)]
    tokens = answer.usage.input_tokens
    return w.encode(w.EmbeddingList(data=data, model=model,
                                    usage=w.EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)))
