"""KV-cache affinity on the request path (docs/operations.md "KV-cache affinity").

For an upstream with `[endpoints]` and `affinity = "prefix"` (the default), a chat or text
completion request asks the store which replicas served its prompt's longest prefixes
(`domain.affinity`, salted with the consumer's cache salt, so two consumers never share),
hands them to the gate as `prefer` with `affinity_max_extra_in_flight` as `max_extra`, and
once admitted records where it went. Anything else (no `[endpoints]`, affinity off, a
prompt shorter than one block, embeddings) skips all of it: no chain is computed, and for an
upstream that does not use affinity the services do not even call `wish` and `granted` (`wanted`).

The gate keeps a preference only for a request admitted on arrival; one admitted later
from the queue goes to the least loaded replica. The store is fail-open (it finds
nothing when its backend is down), so affinity never fails a request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from domain.affinity import affinity_chain, key_hash, prefix_hashes
from domain.canonical import ChatRequest
from domain.completions import CompletionRequest
from domain.consumers import Consumer
from ports.admission import SlotLease
from ports.affinity import AffinityStore

_ENCODER = msgspec.json.Encoder()


class Wish(msgspec.Struct, frozen=True):
    """What a request would like from the gate, and what to record once admitted."""

    chain: Sequence[int] = ()
    prefer: Sequence[str] = ()
    max_extra: int = 0


NO_WISH = Wish()


def completion_chain(request: CompletionRequest, salt: str | None = None) -> list[int]:
    """A text completion's chain: its `user` as the key, else its prompts' prefix (encoded as
    a list without the closing `]`, so a prompt that grows keeps every earlier block)."""
    if request.user:
        return [key_hash(request.user, salt)]
    return prefix_hashes(memoryview(_ENCODER.encode(request.prompt))[:-1], salt)


class Affinity:
    """The upstreams that use affinity (name -> `affinity_max_extra_in_flight`) and the store."""

    __slots__ = ("_max_extra", "_store")

    def __init__(self, store: AffinityStore | None = None, max_extra: Mapping[str, int] | None = None) -> None:
        self._store = store
        self._max_extra = dict(max_extra or {}) if store is not None else {}

    def wanted(self, upstream: str) -> bool:
        return upstream in self._max_extra

    async def wish(self, upstream: str, request: ChatRequest | CompletionRequest, consumer: Consumer) -> Wish:
        """The replicas `request` would like (longest matching prefix first); NO_WISH at once when
        the upstream does not use affinity."""
        max_extra = self._max_extra.get(upstream)
        if max_extra is None or self._store is None:
            return NO_WISH
        salt = consumer.cache_salt
        if isinstance(request, ChatRequest):
            chain = affinity_chain(request, salt)
        else:
            chain = completion_chain(request, salt)
        if not chain:
            return NO_WISH
        return Wish(chain, await self._store.lookup(upstream, chain), max_extra)

    async def granted(self, upstream: str, wish: Wish, lease: SlotLease) -> None:
        """The request with `wish` was admitted on `lease`: its prefixes now point at its replica."""
        replica: str | None = getattr(lease, "replica", None)
        if wish.chain and replica is not None and self._store is not None:
            await self._store.record(upstream, wish.chain, replica)
