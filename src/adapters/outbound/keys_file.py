"""The keys file: consumers and the digests of their API keys (a `CredentialStore`).

```toml
[consumers.frontend]
keys = ["sha256:<64 hex>"]      # several = rotation
requests_per_minute = 600       # every limit optional
```
The file is separate from the main config so it can be a Kubernetes Secret. It is
loaded at start (a bad file stops startup) and polled every `reload_interval` seconds:
a change of mtime, size or inode (a Secret update swaps a symlink) re-reads it, and a
different content hash re-parses it and swaps the whole digest -> consumer table in one
assignment. A bad file at reload keeps the previous table and logs one error naming
the file and the key path that failed. Messages never quote a value: a key pasted
where its digest belongs must not end up in a log.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import re
import secrets
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from domain.cache_salt import MIN_SECRET_BYTES, cache_salt, fallback_secret
from domain.consumers import Consumer, ConsumerLimits, key_digest, same_digest

log = logging.getLogger("gateway.auth")

_DIGEST = r"^sha256:[0-9a-f]{64}$"
PositiveInt = Annotated[int, Meta(gt=0)]


class KeysFileError(Exception):
    """A keys file that cannot be used; the message names the file's key path, never a value."""


class _ConsumerTable(Struct, kw_only=True, forbid_unknown_fields=True):
    keys: list[Annotated[str, Meta(pattern=_DIGEST)]]
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    tokens_per_day: PositiveInt | None = None
    max_in_flight: PositiveInt | None = None
    priority: int = 0  # queue order under `fairness = "fair"`: higher first
    weight: PositiveInt = 1  # share between consumers of one priority (tags clamp at 16)


# digest -> (the same digest, for the constant-time comparison; its consumer)
Table = dict[str, tuple[str, Consumer]]

_AT = re.compile(r"\s*-\s*at\s*`\$([^`]*)`\s*$")
_FIELD = re.compile(r"field `([^`]+)`")


def _key_path(error: msgspec.ValidationError, prefix: str) -> str:
    """msgspec's `... - at `$.keys[0]`` as `consumers.NAME.keys[0]: what is wrong`."""
    text = str(error)
    at = _AT.search(text)
    where = prefix + (at.group(1) if at else "")
    message = _AT.sub("", text)
    field = _FIELD.search(message)
    if field and ("unknown field" in message or "missing required field" in message):
        path = f"{where}.{field.group(1)}" if where else field.group(1)
        return f"{'unknown' if 'unknown' in message else 'missing required'} key '{path}'"
    if "matching regex" in message:
        message = "not a digest: expected 'sha256:' and 64 lowercase hex digits (see `gateway keys new`)"
    return f"invalid value for '{where}': {message}" if where else message


def parse_keys(text: bytes | str, salt_secret: bytes | None = None) -> Table:
    """The digest -> consumer table of a keys file's content; raises `KeysFileError`.

    Each consumer gets its prefix-cache salt (`domain.cache_salt`): from `salt_secret`
    (`[auth] cache_salt_secret_file`), or else from its own key digests.
    """
    try:
        document = msgspec.toml.decode(text)
    except msgspec.DecodeError as exc:
        raise KeysFileError(f"not valid TOML: {exc}") from None
    unknown = sorted(set(document) - {"consumers"})
    if unknown:
        raise KeysFileError(f"unknown key '{unknown[0]}' (a keys file holds only [consumers.NAME] tables)")
    tables = document.get("consumers", {})
    if not isinstance(tables, dict):
        raise KeysFileError("invalid value for 'consumers': expected [consumers.NAME] tables")
    entries: dict[str, _ConsumerTable] = {}
    for name, raw in tables.items():
        try:  # one table at a time, so an error names its consumer (msgspec shows dict keys as [...])
            entries[name] = msgspec.convert(raw, _ConsumerTable)
        except msgspec.ValidationError as exc:
            raise KeysFileError(_key_path(exc, f"consumers.{name}")) from None
    table: Table = {}
    holder: dict[str, str] = {}  # digest -> where it was first seen, for the duplicate message
    for name, entry in entries.items():
        consumer = Consumer(name=name, limits=ConsumerLimits(
            requests_per_minute=entry.requests_per_minute, tokens_per_minute=entry.tokens_per_minute,
            tokens_per_day=entry.tokens_per_day, max_in_flight=entry.max_in_flight,
        ), priority=entry.priority, weight=entry.weight,
            cache_salt=cache_salt(salt_secret or fallback_secret(entry.keys), name))
        for index, digest in enumerate(entry.keys):
            where = f"consumers.{name}.keys[{index}]"
            first = holder.get(digest)
            if first is not None and table[digest][1].name != name:
                raise KeysFileError(f"'{where}' is the same key as '{first}': a key belongs to one consumer")
            holder.setdefault(digest, where)
            table[digest] = (digest, consumer)
    return table


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise KeysFileError(f"cannot read keys file '{path}': {exc.strerror}") from None


def _parse_file(path: str | Path, content: bytes, salt_secret: bytes | None = None) -> Table:
    try:
        return parse_keys(content, salt_secret)
    except KeysFileError as exc:
        raise KeysFileError(f"keys file '{path}': {exc}") from None


def read_keys_file(path: str | Path) -> Table:
    """The table of the file at `path`; raises `KeysFileError` naming the file."""
    return _parse_file(path, _read(path))


def read_salt_secret(path: str | Path) -> bytes:
    """`[auth] cache_salt_secret_file`: its bytes, surrounding whitespace removed (a Secret
    mounted from `kubectl create secret --from-literal` ends in no newline, one edited by
    hand often does); raises `KeysFileError` naming the file, never quoting it."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise KeysFileError(f"cannot read cache_salt_secret_file '{path}': {exc.strerror}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise KeysFileError(f"cache_salt_secret_file '{path}' holds {len(secret)} bytes; at least "
                            f"{MIN_SECRET_BYTES} are needed (e.g. `openssl rand -base64 32`)")
    return secret


def _signature(path: str) -> tuple[int, int, int, int] | None:
    """What a change of the file (or of the symlink target it resolves to) changes."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


class KeysFileStore:
    """The `CredentialStore` on a keys file, polled for changes (module doc)."""

    def __init__(self, path: str, reload_interval: float, salt_secret: bytes | None = None) -> None:
        self._path = path
        self._salt_secret = salt_secret
        self._interval = reload_interval
        self._table: Table = {}
        self._hash = b""  # of the content in use
        self._failed_hash: bytes | None = None  # of a bad content already logged
        self._signature: tuple[int, int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self._named: tuple[Table, dict[str, Consumer]] = ({}, {})  # (the table it was made of, by name)

    def named(self, name: str) -> Consumer | None:
        """The consumer called `name` in the file now (the status page shows its limits)."""
        table = self._table
        made_of, by_name = self._named
        if made_of is not table:
            by_name = {consumer.name: consumer for _, consumer in table.values()}
            self._named = (table, by_name)
        return by_name.get(name)

    def lookup(self, digest: str) -> Consumer | None:
        entry = self._table.get(digest)  # one reference read: a reload swaps the whole table
        if entry is None or not same_digest(entry[0], digest):
            return None
        return entry[1]

    def load(self) -> None:
        """Read the file now; raises `KeysFileError` (startup stops)."""
        signature = _signature(self._path)
        content = _read(self._path)
        self._table = _parse_file(self._path, content, self._salt_secret)
        self._hash = hashlib.sha256(content).digest()
        self._signature = signature
        log.info("keys file '%s': %s", self._path, self._summary())

    async def start(self) -> None:
        self.load()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def reload_if_changed(self) -> bool:
        """One poll: re-read a changed file; True when the table was replaced.

        A bad file is reported once (per change of the file) and the previous table stays.
        """
        signature = _signature(self._path)
        if signature == self._signature:
            return False
        self._signature = signature
        content_hash: bytes | None = None
        try:
            content = await asyncio.to_thread(_read, self._path)
            content_hash = hashlib.sha256(content).digest()
            if content_hash in (self._hash, self._failed_hash):
                return False  # touched or re-linked, same content
            # Off the event loop: a file of 10,000 keys takes a while to parse.
            table = await asyncio.to_thread(_parse_file, self._path, content, self._salt_secret)
        except KeysFileError as exc:
            self._failed_hash = content_hash
            log.error("%s; keeping the previous consumers (%s)", exc, self._summary())
            return False
        self._table, self._hash, self._failed_hash = table, content_hash, None
        log.info("keys file '%s' reloaded: %s", self._path, self._summary())
        return True

    def _summary(self) -> str:
        consumers = {consumer.name for _, consumer in self._table.values()}
        return f"{len(consumers)} consumers with {len(self._table)} keys"

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.reload_if_changed()
            except Exception:  # never let the watcher die: the previous table stays in use
                log.exception("keys file '%s': reload failed", self._path)


# --- `gateway keys new` -------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def new_key() -> str:
    """A new key `gw_<key id: 8 hex>_<secret: 256 random bits as 43 base64url chars>`."""
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode("ascii")
    return f"gw_{secrets.token_hex(4)}_{secret}"


def keys_entry(consumer: str, key: str) -> str:
    """The keys-file lines holding `key`'s digest for `consumer` (the name quoted when TOML needs it)."""
    name = consumer if _BARE_KEY.fullmatch(consumer) else msgspec.json.encode(consumer).decode()
    return f'[consumers.{name}]\nkeys = ["{key_digest(key)}"]\n'
