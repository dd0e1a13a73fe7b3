"""`[auth]`: API keys and what a consumer may hold."""

from __future__ import annotations

from typing import Literal

from config.section import NonNegativeInt, PositiveFloat, Section


class AuthConfig(Section):
    """API keys (docs/operations.md): off (one anonymous consumer) unless mode = "required"."""

    mode: Literal["off", "required"] = "off"
    keys_file: str | None = None  # required with mode = "required"
    # How often the keys file is checked for changes: also the revocation delay.
    reload_interval_seconds: PositiveFloat = 5.0
    # Requests of one consumer waiting for one of its `max_in_flight` slots (per process);
    # one more is a 429.
    max_waiting_per_consumer: NonNegativeInt = 64
    # The secret behind each consumer's vLLM `cache_salt` (domain.cache_salt); none: derived
    # from each consumer's own key digests in the keys file.
    cache_salt_secret_file: str | None = None
