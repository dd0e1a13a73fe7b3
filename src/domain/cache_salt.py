"""vLLM's prefix-cache salt per consumer (pure): `cache_salt` on every upstream body.

vLLM's automatic prefix caching shares KV blocks between requests with the same prompt
prefix; a request whose prefix is cached starts measurably sooner, so without a salt one
tenant can time whether another tenant sent a given prompt. A salt mixed into the block
hashes separates the tenants: the gateway sets one per consumer (API keys on), never
taking a client's.

The salt is HMAC-SHA256(secret, "gateway cache_salt v1\\0" + consumer name), 43 characters
of base64url (256 bits, what vLLM's docs ask for): the same in every gateway process and
pod that has the same secret (so a consumer's prefix cache still works whichever replica of
the gateway it reaches) and unguessable without the secret.

The secret is `[auth] cache_salt_secret_file` when set. Without it, each consumer's secret
is the SHA-256 of its own key digests in the keys file (sorted): just as stable across
processes and pods (they all read the same keys file), as secret as the keys file, and no
other consumer can compute it; rotating a consumer's keys changes its salt once (its
cached prefixes are recomputed), which the secret file avoids.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable

_LABEL = b"gateway cache_salt v1\x00"
MIN_SECRET_BYTES = 16


def cache_salt(secret: bytes, consumer: str) -> str:
    """The salt of `consumer` under `secret`: 43 base64url characters."""
    digest = hmac.new(secret, _LABEL + consumer.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def fallback_secret(key_digests: Iterable[str]) -> bytes:
    """A consumer's secret without `cache_salt_secret_file`: from its own key digests."""
    return hashlib.sha256("\n".join(sorted(key_digests)).encode("ascii", "replace")).digest()
