"""API keys at the edge: what the edge checks of every dialect Router verify when keys are
required (`dialect._edge_checks`).

A key comes as `Authorization: Bearer <key>` (OpenAI clients) or `x-api-key: <key>`
(Anthropic clients); both are accepted on every surface, and two different keys in one
request are refused. Only the key's SHA-256 digest is looked up. It runs after the
header-size check and before the handler, so a refused request never reaches
limits or admission; the identity it finds goes on the request's `Call`. No message
quotes a key: only its non-secret key id, when it has one.
"""

from __future__ import annotations

from collections.abc import Iterable

from adapters.inbound._shared.edge import Call
from domain.consumers import Identity, key_digest, key_id
from domain.errors import InvalidApiKey
from ports.consumers import CredentialStore

_BEARER = b"bearer "
MISSING = "No API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`."
TWO_KEYS = "The request carries two different API keys; send one (`Authorization: Bearer` or `x-api-key`)."
NOT_BEARER = "The Authorization header must be `Bearer <key>`."


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The one key a request carries (raw bytes); raises `InvalidApiKey` for none or two."""
    found: bytes | None = None
    for name, value in headers:
        if name == b"authorization":
            if value[:7].lower() != _BEARER:
                raise InvalidApiKey(NOT_BEARER)
            value = value[7:]
        elif name != b"x-api-key":
            continue
        value = value.strip()
        if not value:
            continue
        if found is not None and found != value:
            raise InvalidApiKey(TWO_KEYS)
        found = value
    if found is None:
        raise InvalidApiKey(MISSING)
    return found


def authenticate(headers: Iterable[tuple[bytes, bytes]], store: CredentialStore) -> Identity:
    """The identity of the key a request carries; raises `InvalidApiKey`."""
    raw = presented_key(headers)
    # A key is printable ASCII; anything else cannot be in the file (and is not echoed).
    key = raw.decode("ascii", "replace")
    consumer = store.lookup(key_digest(key)) if raw.isascii() and key.isprintable() else None
    ident = key_id(key)
    if consumer is None:
        which = f"The API key with id {ident}" if ident else "The API key"
        raise InvalidApiKey(f"{which} is not valid (unknown or revoked).")
    return Identity(consumer=consumer, key_id=ident)


def identify(call: Call, headers: Iterable[tuple[bytes, bytes]], store: CredentialStore) -> None:
    """The request's identity on its `Call` and record, or `InvalidApiKey` (401)."""
    identity = authenticate(headers, store)
    call.identity = identity
    call.record.consumer = identity.consumer.name
    call.record.key_id = identity.key_id
