"""Each consumer's vLLM `cache_salt`: set by the keys file store, stable, unguessable.

With `[auth] cache_salt_secret_file` the salt is HMAC-SHA256(secret, name); without it the
secret is each consumer's own key digests. Either way: the same for one consumer in every
process that reads the same files, different between consumers, 43 base64url characters.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.processes import ROOT, SRC

from adapters.outbound.keys_file import KeysFileError, keys_entry, new_key, parse_keys, read_salt_secret
from domain.cache_salt import cache_salt, fallback_secret
from domain.consumers import key_digest

A, B, A2 = new_key(), new_key(), new_key()
TEXT = keys_entry("alice", A) + keys_entry("bob", B)


def salts(text: str, secret: bytes | None = None) -> dict[str, str | None]:
    return {consumer.name: consumer.cache_salt for _, consumer in parse_keys(text, secret).values()}


def test_salts_are_per_consumer_stable_and_shaped_as_vllm_asks() -> None:
    first, again = salts(TEXT), salts(TEXT)
    assert first == again and first["alice"] != first["bob"]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}", s or "") for s in first.values())
    assert first["alice"] == cache_salt(fallback_secret([key_digest(A)]), "alice")


def test_a_secret_file_decides_the_salt_and_survives_key_rotation() -> None:
    secret = b"0123456789abcdef0123"
    with_secret = salts(TEXT, secret)
    assert with_secret["alice"] == cache_salt(secret, "alice") != salts(TEXT)["alice"]
    rotated = f'[consumers.alice]\nkeys = ["{key_digest(A)}", "{key_digest(A2)}"]\n' + keys_entry("bob", B)
    assert salts(rotated, secret)["alice"] == with_secret["alice"]  # the secret: rotation keeps the salt
    assert salts(rotated)["alice"] != salts(TEXT)["alice"]  # the fallback: rotation changes it (documented)


def test_the_secret_file_is_read_stripped_and_must_be_long_enough(tmp_path: Path) -> None:
    good, short = tmp_path / "good", tmp_path / "short"
    good.write_text("a-long-enough-secret-value\n")
    short.write_text("tiny")
    assert read_salt_secret(good) == b"a-long-enough-secret-value"
    with pytest.raises(KeysFileError, match="at least 16"):
        read_salt_secret(short)
    with pytest.raises(KeysFileError, match="cannot read"):
        read_salt_secret(tmp_path / "missing")


def test_serve_refuses_to_start_on_a_bad_secret_file(tmp_path: Path) -> None:
    keys, secret = tmp_path / "keys.toml", tmp_path / "secret"
    keys.write_text(TEXT)
    secret.write_text("tiny")
    config = tmp_path / "gateway.toml"
    config.write_text(f'[upstreams.u]\nurl = "http://127.0.0.1:9"\nmodels = ["m"]\n[auth]\nmode = "required"\n'
                      f'keys_file = "{keys}"\ncache_salt_secret_file = "{secret}"\n')
    done = subprocess.run([sys.executable, "-m", "cli", "serve", "--config", str(config)], cwd=ROOT,
                          env={"PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "auth.cache_salt_secret_file" in done.stderr and "tiny" not in done.stderr
