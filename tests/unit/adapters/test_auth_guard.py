"""Which key a request carries, and who it belongs to (a fake credential store)."""

from __future__ import annotations

import pytest

from adapters.inbound._shared import auth
from adapters.inbound._shared.auth import Authenticator, presented_key
from domain.consumers import Consumer, key_digest
from domain.errors import InvalidApiKey

KEY = "gw_1a2b3c4d_" + "k" * 43
OTHER = "gw_99999999_" + "o" * 43
FRONTEND = Consumer(name="frontend")


class FakeCredentialStore:
    def __init__(self, keys: dict[str, Consumer]) -> None:
        self.by_digest = {key_digest(key): consumer for key, consumer in keys.items()}
        self.lookups: list[str] = []

    def lookup(self, digest: str) -> Consumer | None:
        self.lookups.append(digest)
        return self.by_digest.get(digest)

    async def start(self) -> None: ...

    async def close(self) -> None: ...


@pytest.mark.parametrize(
    "headers",
    [
        [(b"authorization", b"Bearer " + KEY.encode())],
        [(b"authorization", b"bearer  " + KEY.encode() + b" ")],
        [(b"x-api-key", KEY.encode())],
        [(b"authorization", b"Bearer " + KEY.encode()), (b"x-api-key", KEY.encode())],  # the same key twice
        [(b"x-api-key", b""), (b"authorization", b"Bearer " + KEY.encode())],
    ],
)
def test_either_header_carries_the_key(headers: list[tuple[bytes, bytes]]) -> None:
    assert presented_key([(b"content-type", b"application/json"), *headers]) == KEY.encode()
    identity = Authenticator(FakeCredentialStore({KEY: FRONTEND})).authenticate(headers)
    assert identity.consumer is FRONTEND and identity.key_id == "1a2b3c4d"


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([], "No API key"),
        ([(b"x-api-key", b"  ")], "No API key"),
        ([(b"authorization", b"Basic dXNlcjpwYXNz")], "must be `Bearer <key>`"),
        ([(b"authorization", b"Bearer " + KEY.encode()), (b"x-api-key", OTHER.encode())], "two different API keys"),
        ([(b"x-api-key", KEY.encode()), (b"x-api-key", OTHER.encode())], "two different API keys"),
        ([(b"x-api-key", OTHER.encode())], "The API key with id 99999999 is not valid"),
        ([(b"x-api-key", b"sk-something-else")], "The API key is not valid"),
        ([(b"x-api-key", b"\xff\xfe\x00binary")], "The API key is not valid"),
    ],
)
def test_refusals_are_invalid_api_key_and_never_quote_a_key(
    headers: list[tuple[bytes, bytes]], message: str
) -> None:
    with pytest.raises(InvalidApiKey) as caught:
        Authenticator(FakeCredentialStore({KEY: FRONTEND})).authenticate(headers)
    error = caught.value
    assert error.status == 401 and message in error.message
    for secret in (KEY, OTHER, "sk-something-else", "k" * 43, "o" * 43):
        assert secret not in error.message


def test_only_the_digest_is_looked_up() -> None:
    store = FakeCredentialStore({KEY: FRONTEND})
    Authenticator(store).authenticate([(b"x-api-key", KEY.encode())])
    assert store.lookups == [key_digest(KEY)]


def test_identity_follows_the_store_and_remembers_only_known_digests() -> None:
    headers = [(b"authorization", b"Bearer " + KEY.encode())]
    store = FakeCredentialStore({KEY: FRONTEND})
    keys = Authenticator(store)
    first = keys.authenticate(headers)
    assert keys.authenticate(headers) is first  # made once per known key
    assert store.lookups == [key_digest(KEY)] * 2  # the store is asked every time (reloads, revocations)
    batch = Consumer(name="batch")
    store.by_digest[key_digest(KEY)] = batch  # the keys file reloaded: the key moved
    assert keys.authenticate(headers).consumer is batch
    del store.by_digest[key_digest(KEY)]  # revoked
    with pytest.raises(InvalidApiKey):
        keys.authenticate(headers)
    for n in range(auth.MAX_IDENTITIES + 10):  # random keys: none is remembered
        with pytest.raises(InvalidApiKey):
            keys.authenticate([(b"x-api-key", f"random-{n}".encode())])
    assert keys.remembered() == 1  # the one known key (its last identity), no random one
