"""API keys at the edge: what the edge checks of every dialect Router verify when keys are
required (`dialect._edge_checks`).

A key comes as `Authorization: Bearer <key>` (OpenAI clients) or `x-api-key: <key>`
(Anthropic clients); both are accepted on every surface, and two different keys in one
request are refused. Only the key's SHA-256 digest is looked up (and remembered, with the
identity it found). It runs after the
header-size check and before the handler, so a refused request never reaches
limits or admission; the identity it finds goes on the request's `Call`. No message
quotes a key: only its non-secret key id, when it has one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from adapters.inbound._shared.call import Call
from domain.consumers import DIGEST_PREFIX, Identity, key_id
from domain.errors import InvalidApiKey
from ports.consumers import CredentialStore

_BEARER = b"bearer "
MISSING = "No API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`."
TWO_KEYS = "The request carries two different API keys; send one (`Authorization: Bearer` or `x-api-key`)."
NOT_BEARER = "The Authorization header must be `Bearer <key>`."

MAX_IDENTITIES = 4096  # known keys whose identity an `Authenticator` remembers, at most

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


class Authenticator:
    """Finds the identity of the key a request carries in the keys file (`CredentialStore`).

    The store is asked on every request (a reload or a revocation counts at once), but a
    known key's identity (its consumer, its key id) is made once and remembered by the key's
    digest: no key is kept, and only keys the store knows are remembered, so the memory is
    bounded by the keys file (and cleared past `MAX_IDENTITIES` anyway). One per dialect
    Router, made when the app is built.
    """

    __slots__ = ("_identities", "_store")

    def __init__(self, store: CredentialStore) -> None:
        self._store = store
        self._identities: dict[str, Identity] = {}  # digest -> the identity last made for it

    def authenticate(self, headers: Iterable[tuple[bytes, bytes]]) -> Identity:
        """The identity of the key a request carries; raises `InvalidApiKey`."""
        raw = presented_key(headers)
        # A key is printable ASCII; anything else cannot be in the file (and is not echoed).
        key = raw.decode("ascii", "replace")
        consumer = None
        if raw.isascii() and key.isprintable():
            digest = DIGEST_PREFIX + hashlib.sha256(raw).hexdigest()  # `key_digest(key)`: ASCII is its own UTF-8
            consumer = self._store.lookup(digest)
        if consumer is None:
            ident = key_id(key)
            which = f"The API key with id {ident}" if ident else "The API key"
            raise InvalidApiKey(f"{which} is not valid (unknown or revoked).")
        identities = self._identities
        identity = identities.get(digest)
        if identity is None or identity.consumer is not consumer:  # new, or the keys file reloaded
            if len(identities) >= MAX_IDENTITIES:
                identities.clear()
            identity = identities[digest] = Identity(consumer=consumer, key_id=key_id(key))
        return identity

    def remembered(self) -> int:
        """How many identities are remembered (tests: bounded, known keys only)."""
        return len(self._identities)


def identify(call: Call, headers: Iterable[tuple[bytes, bytes]], keys: Authenticator) -> None:
    """The request's identity on its `Call` and record, or `InvalidApiKey` (401)."""
    identity = keys.authenticate(headers)
    call.identity = identity
    call.record.consumer = identity.consumer.name
    call.record.key_id = identity.key_id
