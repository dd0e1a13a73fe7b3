"""The allowlisted sampling parameters (`domain.sampling`) as OpenAI-style wire members read them.

Both `/v1` request types (chat and text completions) name these members the same way and
decode them with the bounded types of `domain.sampling`; the JSON documents among them
(`response_format`, `structured_outputs`, `guided_json`) arrive as raw JSON, are bounded
in bytes as received (`max_tool_schema_bytes`, like a tool's schema) and only then decoded.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from adapters.inbound._shared.limits import InputLimits, check_raw_size, deep_json
from domain.errors import InvalidRequest
from domain.sampling import Sampling

_OBJECT = msgspec.json.Decoder(dict[str, Any] | None)
_OBJECT_OR_TEXT = msgspec.json.Decoder(dict[str, Any] | str | None)
Member = msgspec.Raw | msgspec.UnsetType  # a JSON member as received; UNSET: absent


class SamplingWire(Protocol):
    """The wire members `decode_sampling` reads (both `/v1` request Structs have them)."""

    min_p: float | None
    repetition_penalty: float | None
    seed: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    logit_bias: dict[str, float] | None
    response_format: Member
    structured_outputs: Member
    guided_json: Member
    guided_choice: list[str] | None
    guided_regex: str | None


def json_member(raw: Member, param: str, limit: int, text_allowed: bool = False) -> Any:
    """A raw JSON member: at most `limit` bytes, an object (or a string when `text_allowed`);
    None when absent or null."""
    if raw is msgspec.UNSET:
        return None
    check_raw_size(raw, limit, param)
    decoder = _OBJECT_OR_TEXT if text_allowed else _OBJECT
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"Invalid field `{param}`: {exc}.", param=param) from None
    except RecursionError:
        raise deep_json() from None


def decode_sampling(wire: SamplingWire, limits: InputLimits) -> Sampling:
    size = limits.max_tool_schema_bytes
    return Sampling(
        min_p=wire.min_p,
        repetition_penalty=wire.repetition_penalty,
        seed=wire.seed,
        presence_penalty=wire.presence_penalty,
        frequency_penalty=wire.frequency_penalty,
        logit_bias=wire.logit_bias,
        response_format=json_member(wire.response_format, "response_format", size),
        structured_outputs=json_member(wire.structured_outputs, "structured_outputs", size),
        guided_json=json_member(wire.guided_json, "guided_json", size, text_allowed=True),
        guided_choice=wire.guided_choice,
        guided_regex=wire.guided_regex,
    )
