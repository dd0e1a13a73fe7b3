"""Decoding `/llm` request bodies, with failures worded the way the Anthropic API words them.

Errors name the offending field with Anthropic's dotted path
(`messages.0.content.1.type`), so a client's own error display stays useful.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from adapters.inbound._shared.limits import deep_json
from domain.errors import InvalidRequest

_AT_PATH = re.compile(r"^(?P<detail>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_BAD_TAG = re.compile(r"^Invalid value (?P<value>.+)$")

T = TypeVar("T")


def invalid(path: str, detail: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {detail}" if path else detail, param=path or None)


def invalid_from(error: msgspec.MsgspecError) -> InvalidRequest:
    """A msgspec failure as Anthropic words it: `$.messages[0].role` -> `messages.0.role`."""
    if not isinstance(error, msgspec.ValidationError):
        return InvalidRequest(f"The request body is not valid JSON: {error}")
    match = _AT_PATH.match(str(error))
    assert match is not None  # the pattern matches any text
    detail = match["detail"]
    path = (match["path"] or "").replace("[", ".").replace("]", "").lstrip(".")
    if missing := _MISSING.match(detail):
        path, detail = f"{path}.{missing['field']}".lstrip("."), "Field required"
    elif (bad := _BAD_TAG.match(detail)) and path.endswith("type"):
        detail = f"Unsupported type {bad['value']}"
    return invalid(path, detail)


def decode_body(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """Decode with `decoder`; every failure (including JSON nested too deeply) is a 400."""
    try:
        return decoder.decode(body)
    except msgspec.MsgspecError as error:
        raise invalid_from(error) from None
    except RecursionError:
        raise deep_json() from None
