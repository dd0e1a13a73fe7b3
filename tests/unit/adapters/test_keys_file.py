"""The keys file: parsed strictly, looked up by digest, reloaded atomically, bad reloads kept out."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.outbound.keys_file import KeysFileError, KeysFileStore, keys_entry, new_key, parse_keys
from domain.consumers import ConsumerLimits, key_digest, key_id

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
C = "sha256:" + "c" * 64


def test_consumers_limits_and_rotation_keys() -> None:
    table = parse_keys(f'[consumers.frontend]\nkeys = ["{A}", "{B}"]\nrequests_per_minute = 600\n'
                       f"tokens_per_minute = 200000\ntokens_per_day = 20000000\nmax_in_flight = 4\n"
                       f'[consumers.batch]\nkeys = ["{C}"]\ntokens_per_minute = 50000\n')
    frontend = table[A][1]
    assert table[B][1] is frontend and frontend.name == "frontend"
    assert frontend.limits == ConsumerLimits(requests_per_minute=600, tokens_per_minute=200000,
                                             tokens_per_day=20000000, max_in_flight=4)
    assert table[C][1].limits == ConsumerLimits(tokens_per_minute=50000)
    assert (frontend.priority, frontend.weight) == (0, 1)  # defaults
    assert parse_keys("") == {}


def test_priority_and_weight() -> None:
    table = parse_keys(f'[consumers.frontend]\nkeys = ["{A}"]\npriority = 10\nweight = 3\n'
                       f'[consumers.batch]\nkeys = ["{B}"]\npriority = -5\n')
    assert (table[A][1].priority, table[A][1].weight) == (10, 3)
    assert (table[B][1].priority, table[B][1].weight) == (-5, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f'[consumers.frontend]\nkeys = ["{A}"]\ntokens_per_mnute = 1\n',
         "unknown key 'consumers.frontend.tokens_per_mnute'"),
        ("[consumers.frontend]\nrequests_per_minute = 1\n", "missing required key 'consumers.frontend.keys'"),
        (f'[consumers.frontend]\nkeys = ["{A}"]\nmax_in_flight = 0\n',
         "invalid value for 'consumers.frontend.max_in_flight'"),
        (f'[consumers.frontend]\nkeys = ["{A}"]\nrequests_per_minute = "6"\n',
         "invalid value for 'consumers.frontend.requests_per_minute'"),
        (f'[consumers.frontend]\nkeys = ["{A}"]\nweight = 0\n', "invalid value for 'consumers.frontend.weight'"),
        (f'[consumers.frontend]\nkeys = ["{A}"]\npriority = 1.5\n',
         "invalid value for 'consumers.frontend.priority'"),
        (f'[consumers.frontend]\nkeys = ["{A}"]\npriority = true\n',
         "invalid value for 'consumers.frontend.priority'"),
        (f'[consumers.x]\nkeys = ["{A}", "sha256:ABC"]\n', "invalid value for 'consumers.x.keys[1]': not a digest"),
        ('[consumers.x]\nkeys = "sha256:..."\n', "invalid value for 'consumers.x.keys'"),
        (f'[consumers.a]\nkeys = ["{A}"]\n[consumers.b]\nkeys = ["{B}", "{A}"]\n',
         "'consumers.b.keys[1]' is the same key as 'consumers.a.keys[0]'"),
        ("[consumer.a]\n", "unknown key 'consumer'"),
        ("consumers = 3\n", "invalid value for 'consumers'"),
        ("[consumers.a\n", "not valid TOML"),
    ],
)
def test_mistakes_name_the_key_path(text: str, message: str) -> None:
    with pytest.raises(KeysFileError) as caught:
        parse_keys(text)
    assert message in str(caught.value)


def test_a_key_pasted_instead_of_its_digest_is_not_quoted() -> None:
    key = new_key()
    with pytest.raises(KeysFileError) as caught:
        parse_keys(f'[consumers.a]\nkeys = ["{key}"]\n')
    assert "consumers.a.keys[0]" in str(caught.value) and key not in str(caught.value)
    # The secret is base64url, so it may hold "_" itself: split at most twice.
    assert key.split("_", 2)[2] not in str(caught.value)


def test_new_key_format_and_entry() -> None:
    key = new_key()
    assert key_id(key) == key.split("_")[1] and len(key.split("_", 2)[2]) == 43
    assert new_key() != key
    entry = keys_entry("frontend", key)
    assert entry == f'[consumers.frontend]\nkeys = ["{key_digest(key)}"]\n'
    assert parse_keys(entry)[key_digest(key)][1].name == "frontend"
    assert parse_keys(keys_entry("front end", key))[key_digest(key)][1].name == "front end"  # quoted


def test_cli_keys_new_prints_the_key_once_and_a_pasteable_entry(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "cli", "keys", "new", "--consumer", "batch"],
                          capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    keys = [line.split()[1] for line in lines if line.startswith("key:")]
    assert len(keys) == 1 and key_id(keys[0]) is not None
    assert done.stdout.count(keys[0]) == 1  # shown once
    entry = "\n".join(line for line in lines if not line.startswith("key:"))
    table = parse_keys(entry)  # the rest pastes into a keys file as it is (the note is a comment)
    assert table[key_digest(keys[0])][1].name == "batch"
    missing = subprocess.run([sys.executable, "-m", "cli", "keys", "new"],
                             capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "--consumer" in missing.stderr


def _write(path: Path, text: str) -> None:
    """Replace the file's content and make sure its stat changes (coarse mtime clocks)."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


async def test_reload_swaps_the_table_and_a_bad_file_keeps_it(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[consumers.a]\nkeys = ["{A}"]\n')
    store = KeysFileStore(str(path), 60)
    store.load()
    assert store.lookup(A) is not None and store.lookup(A).name == "a"  # type: ignore[union-attr]
    assert store.lookup(B) is None
    assert not await store.reload_if_changed()  # unchanged: not even read

    _write(path, f'[consumers.a]\nkeys = ["{A}", "{B}"]\n')  # rotation: a second key
    assert await store.reload_if_changed()
    assert store.lookup(B) is not None and store.lookup(A) is not None
    _write(path, f'[consumers.a]\nkeys = ["{B}"]\n')  # the old key removed: revoked
    assert await store.reload_if_changed()
    assert store.lookup(A) is None and store.lookup(B) is not None

    caplog.set_level(logging.INFO, logger="gateway.auth")
    _write(path, f'[consumers.a]\nkeys = ["{B}"]\nmax_in_fligt = 2\n')
    assert not await store.reload_if_changed()
    assert store.lookup(B) is not None  # the previous table stays
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0] and "consumers.a.max_in_fligt" in errors[0]
    os.utime(path, ns=(0, time.time_ns()))  # touched, same bad content: not logged again
    assert not await store.reload_if_changed()
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1

    path.unlink()  # a vanished file: logged, the table stays
    assert not await store.reload_if_changed()
    assert store.lookup(B) is not None
    _write(path, f'[consumers.c]\nkeys = ["{C}"]\n')
    assert await store.reload_if_changed()
    assert store.lookup(B) is None and store.lookup(C) is not None


async def test_a_kubernetes_secret_swap_is_seen(tmp_path: Path) -> None:
    """kubelet writes a new `..<timestamp>` directory and swaps the `..data` symlink to it."""
    mount = tmp_path / "keys"
    mount.mkdir()
    first = mount / "..2024_01_01"
    first.mkdir()
    (first / "keys.toml").write_text(f'[consumers.a]\nkeys = ["{A}"]\n')
    (mount / "..data").symlink_to(first.name)
    (mount / "keys.toml").symlink_to("..data/keys.toml")
    store = KeysFileStore(str(mount / "keys.toml"), 60)
    store.load()
    second = mount / "..2024_01_02"
    second.mkdir()
    (second / "keys.toml").write_text(f'[consumers.a]\nkeys = ["{B}"]\n')
    # Same size, maybe the same mtime: the inode tells them apart.
    os.utime(second / "keys.toml", ns=((first / "keys.toml").stat().st_atime_ns,
                                       (first / "keys.toml").stat().st_mtime_ns))
    (mount / "..data_tmp").symlink_to(second.name)
    os.replace(mount / "..data_tmp", mount / "..data")
    assert await store.reload_if_changed()
    assert store.lookup(A) is None and store.lookup(B) is not None


async def test_polling_picks_up_a_change(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[consumers.a]\nkeys = ["{A}"]\n')
    store = KeysFileStore(str(path), 0.05)
    await store.start()
    try:
        _write(path, f'[consumers.a]\nkeys = ["{B}"]\n')
        for _ in range(250):  # up to 5 s
            if store.lookup(B) is not None:
                break
            await asyncio.sleep(0.02)
        assert store.lookup(B) is not None and store.lookup(A) is None
    finally:
        await store.close()


def test_a_bad_file_at_start_raises(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text("[consumers.a]\nkeys = [1]\n")
    with pytest.raises(KeysFileError, match=r"keys\.toml.*consumers\.a\.keys\[0\]"):
        KeysFileStore(str(path), 1).load()
    with pytest.raises(KeysFileError, match="cannot read keys file"):
        KeysFileStore(str(tmp_path / "absent.toml"), 1).load()


def test_ten_thousand_keys_load_and_look_up(tmp_path: Path) -> None:
    keys = [new_key() for _ in range(10_000)]
    path = tmp_path / "keys.toml"
    path.write_text("".join(keys_entry(f"c{i}", key) for i, key in enumerate(keys)))
    store = KeysFileStore(str(path), 1)
    started = time.perf_counter()
    store.load()
    loaded = time.perf_counter() - started
    assert loaded < 10, loaded  # about 0.6 s on one idle core (tomllib)
    started = time.perf_counter()
    names = [store.lookup(key_digest(key)) for key in keys]
    looked_up = time.perf_counter() - started
    assert [c.name if c else None for c in names] == [f"c{i}" for i in range(10_000)]
    assert looked_up < 1, looked_up  # a dict lookup each, with the digest (about 20 ms)
