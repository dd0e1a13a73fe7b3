"""What the gateway prints of secrets in its configuration: nothing (`gateway check-config`,
configuration errors).

A URL keeps its scheme, host, port and path; its password becomes `***`
(`redis://:***@gateway-redis:6379/0`), a user name without a password too (it may be a
token), and so does any query parameter named like a secret. A key named like a secret
(one of its words is password, secret, token, credentials, headers or authorization, or
it ends in `key`, as `api_key` does) has its whole value replaced, whatever its type; `null` stays `null`, so an unset
key still shows as unset.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
_SECRET_WORDS = frozenset({"password", "passwd", "pwd", "secret", "token", "credential", "credentials",
                           "headers", "authorization", "apikey"})
_MEASURE_WORDS = frozenset({"weight"})
_WORDS = re.compile(r"[a-z0-9]+")


def secret_name(name: str) -> bool:
    """Whether a key or query parameter is named like a secret (`api_key`, `x-api-key`,
    `password`, `otlp_headers`, `token`...): whole words, so `max_output_tokens` and
    `key_prefix` are not, and a name ending in the word `key` is. A name ending in `weight`
    names a number (`output_token_weight`: what a token counts for), never a secret."""
    words = _WORDS.findall(name.lower())
    if not words or words[-1] in _MEASURE_WORDS:
        return False
    return words[-1] == "key" or any(word in _SECRET_WORDS for word in words)


def masked_url(text: str) -> str:
    """`text` with the password (or a lone user name) and secret query parameters masked; a
    string that is not a URL with a host is returned as it is."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.scheme or not parts.netloc:
        return text
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if has_password else f"{MASK}@{host}"
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(secret_name(name) for name, _ in pairs):
            query = urlencode([(name, MASK if secret_name(name) else value) for name, value in pairs], safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return text
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redacted(value: Any, name: str = "") -> Any:
    """A copy of plain data (dicts, lists, strings...) with every secret masked (module doc)."""
    if name and secret_name(name) and value is not None:
        return MASK
    if isinstance(value, dict):
        return {key: redacted(item, str(key)) for key, item in value.items()}
    if isinstance(value, list):
        return [redacted(item) for item in value]
    if isinstance(value, str):
        return masked_url(value)
    return value
