"""What every table of the configuration file shares: unknown keys are errors, the number
types the keys use, and `ConfigError`, whose message names the offending key."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

PositiveFloat = Annotated[float, Meta(gt=0)]
PositiveInt = Annotated[int, Meta(gt=0)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Port = Annotated[int, Meta(ge=1, le=65535)]


class ConfigError(Exception):
    """A configuration mistake; the message names the offending key."""


class Section(Struct, kw_only=True, forbid_unknown_fields=True):
    """Base: unknown keys are errors (a typo must not silently fall back to a default)."""
