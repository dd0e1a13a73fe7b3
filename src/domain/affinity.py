"""KV-cache affinity: which replica a request would like, from what went where before.

vLLM's automatic prefix caching keeps the KV blocks of the prompts a replica computed,
keyed by a hash chain over the prompt's full blocks; an agent's next turn re-sends the
whole conversation, so on the replica that served the last turn every earlier block is
a hit, and on any other it is computed again. The gateway cannot see tokens; it does
what the llm-d picker's approximate prefix scorer does: the same chain over the
canonical prompt's bytes.

- **The chain** (`affinity_chain`): the request's `affinity_key` (the dialect's field
  for exactly this: `/v1` `prompt_cache_key` or `user`, `/llm` `metadata.user_id`) is
  one hash. Otherwise the prompt is the canonical encoding of its tools and then its
  messages, in order (the encoding of a turn never depends on the turns after it, so a
  conversation's next turn starts with every byte of the last one), cut into blocks of
  `BLOCK_BYTES`; the hash after block n covers every byte before it. Hashes are taken
  at checkpoints: after each of the first `DENSE_BLOCKS` blocks, then every
  `SPARSE_EVERY`th, up to `MAX_BLOCKS` (a longer prompt's tail is not told apart), so
  a lookup or a record costs at most `CHECKPOINTS` + `TAIL_MESSAGES` hashes. The end of
  each of the last `TAIL_MESSAGES` messages is a checkpoint too (at least one block in,
  within `MAX_BLOCKS`): a conversation's next turn appends messages, so it holds the
  last turn's whole prompt at one of its own message ends, and finds it even when the
  turns differ by less than `SPARSE_EVERY` blocks past a long shared system prompt
  (block checkpoints alone would find only the shared prompt there, so turn 2 of every
  agent with a system prompt of more than `DENSE_BLOCKS` blocks would go anywhere).
  A prompt shorter than one block has no chain. An optional salt (a per-consumer cache
  salt: vLLM keeps such prompts apart) starts the chain.
- **The memory** (`AffinityMemory`): chain hash -> the replica last sent a request with
  that prefix, least recently recorded evicted first, `capacity` entries, each
  forgotten `ttl_seconds` after it was last recorded. `lookup` names the replicas that
  served the longest recorded prefixes, longest first; the pick
  (`domain.replicas.pick(prefer=...)`) takes the first with room within
  `affinity_max_extra_in_flight` of the least loaded.

Entries are 64-bit hashes; one record shares one value among its entries, so an entry
costs about 80 bytes: the default 32,768 entries stay under 3 MB per upstream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from domain.canonical import ChatRequest

BLOCK_BYTES = 256  # about 64 tokens of English text; vLLM's block is 16 tokens
# Each checkpoint costs about a microsecond (a copy and a digest of the running hash) on top of
# hashing the bytes once: few of them, as the message ends find a conversation's last turn.
DENSE_BLOCKS = 8  # every block a checkpoint up to here (2 KiB of prompt) ...
SPARSE_EVERY = 16  # ... then every 16th block (4 KiB)
MAX_BLOCKS = 1024  # 256 KiB of prompt
CHECKPOINTS = DENSE_BLOCKS + (MAX_BLOCKS - DENSE_BLOCKS) // SPARSE_EVERY  # 71
TAIL_MESSAGES = 8  # the ends of the last 8 messages are checkpoints too (a turn adds fewer)

DEFAULT_CAPACITY = 32_768  # entries per upstream
DEFAULT_TTL_SECONDS = 900.0

_ENCODER = msgspec.json.Encoder()
_PREFIX = b"gateway-prefix\0"  # domain separation: a key never hashes like a prompt
_KEY = b"gateway-key\0"


def affinity_chain(request: ChatRequest, salt: str | None = None) -> list[int]:
    """The hashes `request`'s affinity is looked up and recorded under, longest prefix first."""
    if request.affinity_key is not None:
        return [key_hash(request.affinity_key, salt)]
    lead, data, ends = prompt_parts(request)
    return prefix_hashes(data, salt, ends, lead)


def key_hash(key: str, salt: str | None = None) -> int:
    hasher = hashlib.sha256(_KEY)
    _salt(hasher, salt)
    hasher.update(key.encode())
    return int.from_bytes(hasher.digest()[:8], "big")


def prompt_bytes(request: ChatRequest) -> bytes:
    """Tools, then every message, encoded so a turn's bytes begin its successor's."""
    lead, data, _ = prompt_parts(request)
    return bytes(lead) + bytes(data)


def prompt_parts(request: ChatRequest) -> tuple[bytes, memoryview, list[int]]:
    """`prompt_bytes` as its tools' encoding and its messages' (the list without its closing
    `]`: a view, not a copy), and where each of the last `TAIL_MESSAGES` messages ends in the
    whole. One encoding of the list; the tail's lengths come from encoding those again."""
    messages = request.messages
    lead = _ENCODER.encode(request.tools) if request.tools else b""
    encoded = _ENCODER.encode(messages)
    at = len(lead) + len(encoded) - 1
    ends: list[int] = []
    if messages:
        ends.append(at)
        for message in reversed(messages[-TAIL_MESSAGES:][1:]):
            at -= len(_ENCODER.encode(message)) + 1  # the message and the `,` before it
            ends.append(at)
        ends.reverse()
    return lead, memoryview(encoded)[:-1], ends


def checkpoints(blocks: int) -> Iterable[int]:
    """The block counts (1-based) after which the chain is hashed, for a prompt of `blocks`."""
    blocks = min(blocks, MAX_BLOCKS)
    yield from range(1, min(blocks, DENSE_BLOCKS) + 1)
    yield from range(DENSE_BLOCKS + SPARSE_EVERY, blocks + 1, SPARSE_EVERY)


def prefix_hashes(data: bytes | memoryview, salt: str | None = None, ends: Sequence[int] = (),
                  lead: bytes = b"") -> list[int]:  # fmt: skip
    """The chain over `lead` + `data` (hashed in place, never joined) at each block checkpoint
    and at each of `ends` (byte offsets into the whole, where messages end: those at least one
    block in and within `MAX_BLOCKS`), longest prefix first."""
    hasher = hashlib.sha256(_PREFIX)
    _salt(hasher, salt)
    view, head = memoryview(data), len(lead)
    size = head + len(view)
    marks = [count * BLOCK_BYTES for count in checkpoints(size // BLOCK_BYTES)]
    if ends:
        limit = min(size, MAX_BLOCKS * BLOCK_BYTES)
        marks = sorted({*marks, *(end for end in ends if BLOCK_BYTES <= end <= limit)})
    out: list[int] = []
    done = 0
    for mark in marks:
        if done < head:
            hasher.update(lead[done:min(mark, head)])
        if mark > head:
            hasher.update(view[max(done - head, 0) : mark - head])
        done = mark
        out.append(int.from_bytes(hasher.copy().digest()[:8], "big"))
    out.reverse()
    return out


def _salt(hasher: Any, salt: str | None) -> None:  # a hashlib hash
    if salt:
        raw = salt.encode()
        hasher.update(len(raw).to_bytes(4, "big") + raw)


class AffinityMemory:
    """One upstream's memory of what went where: chain hash -> (replica, when recorded)."""

    __slots__ = ("_entries", "capacity", "ttl")

    def __init__(self, capacity: int = DEFAULT_CAPACITY, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        if capacity < 1 or not ttl_seconds > 0:
            raise ValueError("capacity must be >= 1 and ttl_seconds > 0")
        self.capacity = capacity
        self.ttl = ttl_seconds
        self._entries: dict[int, tuple[str, float]] = {}  # insertion order = least recently recorded first

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, chain: Sequence[int], now: float) -> list[str]:
        """The replicas that served `chain`'s prefixes (longest first, each once); expired ones not."""
        entries, oldest = self._entries, now - self.ttl
        out: list[str] = []
        for digest in chain:
            entry = entries.get(digest)
            if entry is not None and entry[1] > oldest and entry[0] not in out:
                out.append(entry[0])
        return out

    def record(self, chain: Sequence[int], replica: str, now: float) -> None:
        """`replica` got a request with `chain`: its prefixes now point there."""
        entries = self._entries
        value = (replica, now)  # one tuple for the whole record
        for digest in chain:
            entries.pop(digest, None)
            entries[digest] = value
        self._expire(now)
        while len(entries) > self.capacity:
            del entries[next(iter(entries))]

    def _expire(self, now: float) -> None:
        entries, oldest = self._entries, now - self.ttl
        while entries:
            first = next(iter(entries))
            if entries[first][1] > oldest:
                break
            del entries[first]
