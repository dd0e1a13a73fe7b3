"""The Redis ledger's Lua scripts compile and name no undefined variable, so a broken script
fails here rather than on the first request that runs it.

- Redis itself: every script as sent (`common.lua` + `<name>.lua`) and every file alone goes
  through the real server's SCRIPT LOAD, which compiles the text and refuses a syntax error.
  Needs the Redis at GATEWAY_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and FAILS when
  it is unreachable (scripts/ensure-redis).
- luacheck (Debian's lua-check, scripts/ensure-luacheck): what compiles but fails when run, a
  mistyped name (Redis refuses to read or create a global at run time). Unused locals are
  allowed: `common.lua` defines helpers that not every script calls.

Each check also runs on a deliberately broken copy, to show it would catch one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from importlib.resources import files

import pytest
from redis import Redis
from redis.exceptions import RedisError, ResponseError

from adapters.outbound.redis_gate import scripts

REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
LUA = files(scripts.__package__) / "lua"
FILES = sorted(entry.name for entry in LUA.iterdir() if entry.name.endswith(".lua"))
# the globals of Redis's Lua 5.1 sandbox beyond the standard library
REDIS_GLOBALS = ("redis", "KEYS", "ARGV", "cjson", "cmsgpack", "bit", "struct")
# `release` without the `end` of its `if`, and `release` reading a mistyped name
NO_END = ("  released = 1\nend\n", "  released = 1\n")
TYPO = ("  free(ARGV[6])\n", "  fre(ARGV[6])\n")


def broken(change: tuple[str, str]) -> str:
    text = scripts.ALL["release"]
    assert text.count(change[0]) == 1, "the broken copy no longer matches release.lua: update it"
    return text.replace(*change)


@pytest.fixture(scope="module")
def server() -> Iterator[Redis]:
    client = Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=5)
    try:
        client.ping()
    except RedisError as error:
        client.close()
        pytest.fail(f"Redis at {REDIS_URL} is unreachable ({error}); run scripts/ensure-redis")
    yield client
    client.close()


def luacheck(name: str, text: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("luacheck")
    assert binary, "luacheck is required (scripts/ensure-luacheck installs Debian's lua-check)"
    return subprocess.run(
        [binary, "--no-config", "--no-color", "--formatter", "plain", "--std", "lua51",
         "--read-globals", *REDIS_GLOBALS, "--ignore", "211", "--filename", f"{name}.lua", "-"],
        input=text, capture_output=True, text=True, timeout=60, check=False,
    )


def test_every_lua_file_is_a_script_or_the_common_part() -> None:
    assert FILES == sorted(["common.lua", *(f"{name}.lua" for name in scripts.ALL)])


@pytest.mark.parametrize("name", list(scripts.ALL))
def test_each_script_as_sent_loads(server: Redis, name: str) -> None:
    text = scripts.ALL[name]
    assert server.script_load(text) == hashlib.sha1(text.encode()).hexdigest()


@pytest.mark.parametrize("file", FILES)
def test_each_lua_file_loads_on_its_own(server: Redis, file: str) -> None:
    server.script_load((LUA / file).read_text(encoding="utf-8"))


def test_a_script_with_a_syntax_error_is_refused(server: Redis) -> None:
    with pytest.raises(ResponseError, match="Error compiling script"):
        server.script_load(broken(NO_END))


@pytest.mark.parametrize("name", list(scripts.ALL))
def test_luacheck_finds_nothing_in_each_script(name: str) -> None:
    result = luacheck(name, scripts.ALL[name])
    assert result.returncode == 0, result.stdout + result.stderr


def test_luacheck_finds_a_mistyped_name_and_a_syntax_error() -> None:
    typo = luacheck("release", broken(TYPO))
    assert typo.returncode == 1 and "accessing undefined variable 'fre'" in typo.stdout, typo.stdout
    syntax = luacheck("release", broken(NO_END))
    assert syntax.returncode == 2 and "expected 'end'" in syntax.stdout, syntax.stdout
