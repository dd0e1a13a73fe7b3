"""Request failures worded as OpenAI words them, naming the field by its path
(`input[3].content[0].text`), so the SDK's `BadRequestError` says what to fix."""

from __future__ import annotations

import re

import msgspec

from adapters.inbound._shared.limits import deep_json
from adapters.inbound.responses.schema import REQUEST_DECODER, RequestBody
from domain.errors import InvalidRequest

_AT = re.compile(r" - at `\$([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")


def invalid_at(error: msgspec.ValidationError, at: str = "") -> InvalidRequest:
    """A msgspec failure inside the value at path `at` (empty: the body itself)."""
    text = str(error)
    found = _AT.search(text)
    path = at + (found.group(1) if found else "")
    if found:
        text = text[: found.start()]
    missing = _MISSING.match(text)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return InvalidRequest(f"Missing required field `{path.lstrip('.')}`.", param=path.lstrip("."))
    path = path.lstrip(".")
    if not path:
        return InvalidRequest(f"Invalid request body: {text}.")
    return InvalidRequest(f"Invalid field `{path}`: {text}.", param=path)


def decode_body(body: bytes) -> RequestBody:
    """The top level of a request; every failure (JSON nested too deeply too) is a 400."""
    try:
        return REQUEST_DECODER.decode(body)
    except msgspec.ValidationError as error:
        if str(error).startswith("Expected `object`"):
            raise InvalidRequest("The request body must be a JSON object.") from None
        raise invalid_at(error) from None
    except msgspec.DecodeError as error:
        raise InvalidRequest(f"The request body is not valid JSON: {error}") from None
    except RecursionError:
        raise deep_json() from None
