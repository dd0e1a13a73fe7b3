"""The Redis ledgers' Lua scripts compile and name no undefined variable, so a broken script
fails here rather than on the first request that runs it: the admission ledger's
(`redis_gate/lua/`, `common.lua` + `tokens.lua` + `queue.lua` + `<name>.lua`) and the consumer counters'
(`redis_usage/lua/`, `clock.lua` + `rate.lua` or `held.lua` + `<name>.lua`).

- Redis itself: every script as sent and every file alone goes through the real server's
  SCRIPT LOAD, which compiles the text and refuses a syntax error. Needs the Redis at
  GATEWAY_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and FAILS when it is
  unreachable (scripts/ensure-redis).
- luacheck (Debian's lua-check, scripts/ensure-luacheck): what compiles but fails when run, a
  mistyped name (Redis refuses to read or create a global at run time). Unused locals are
  allowed: a common part defines helpers that not every script calls.

Each check also runs on deliberately broken copies, to show it would catch one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from importlib.resources import files
from importlib.resources.abc import Traversable
from types import ModuleType

import pytest
from redis import Redis
from redis.exceptions import RedisError, ResponseError

from adapters.outbound.redis_gate import scripts as gate_scripts
from adapters.outbound.redis_usage import scripts as usage_scripts

REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# ledger -> its scripts module and the files its scripts are made of besides their own
LEDGERS: dict[str, tuple[ModuleType, tuple[str, ...]]] = {
    "gate": (gate_scripts, ("common.lua", "queue.lua", "tokens.lua")),
    "usage": (usage_scripts, ("clock.lua", "rate.lua", "held.lua")),
}
# the globals of Redis's Lua 5.1 sandbox beyond the standard library
REDIS_GLOBALS = ("redis", "KEYS", "ARGV", "cjson", "cmsgpack", "bit", "struct")
# per ledger, a script to break: the change that drops the `end` of a block, the change
# that mistypes a name, and that name
BREAKS = {
    "gate": ("release", ("  released = 1\nend\n", "  released = 1\n"),
             ("  free(ARGV[7])\n", "  fre(ARGV[7])\n"), "fre"),
    "usage": ("renew", ("    missing = missing + 1\n  end\n", "    missing = missing + 1\n"),
              ("    missing = missing + 1\n", "    missing = mising + 1\n"), "mising"),
}


def lua(ledger: str) -> Traversable:
    return files(LEDGERS[ledger][0].__package__) / "lua"


def lua_files(ledger: str) -> list[str]:
    return sorted(entry.name for entry in lua(ledger).iterdir() if entry.name.endswith(".lua"))


SCRIPTS = [(ledger, name) for ledger, (module, _) in LEDGERS.items() for name in module.ALL]
FILES = [(ledger, file) for ledger in LEDGERS for file in lua_files(ledger)]


def sent(ledger: str, name: str) -> str:
    """The script's text as sent to Redis."""
    return str(LEDGERS[ledger][0].ALL[name])


def broken(ledger: str, change: tuple[str, str]) -> str:
    name = BREAKS[ledger][0]
    script = sent(ledger, name)
    assert script.count(change[0]) == 1, f"the broken copy no longer matches {name}.lua: update it"
    return script.replace(*change)


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


@pytest.mark.parametrize("ledger", list(LEDGERS))
def test_every_lua_file_is_a_script_or_a_common_part(ledger: str) -> None:
    module, common = LEDGERS[ledger]
    assert lua_files(ledger) == sorted([*common, *(f"{name}.lua" for name in module.ALL)])


@pytest.mark.parametrize(("ledger", "name"), SCRIPTS)
def test_each_script_as_sent_loads(server: Redis, ledger: str, name: str) -> None:
    script = sent(ledger, name)
    assert server.script_load(script) == hashlib.sha1(script.encode()).hexdigest()


@pytest.mark.parametrize(("ledger", "file"), FILES)
def test_each_lua_file_loads_on_its_own(server: Redis, ledger: str, file: str) -> None:
    server.script_load((lua(ledger) / file).read_text(encoding="utf-8"))


@pytest.mark.parametrize("ledger", list(LEDGERS))
def test_a_script_with_a_syntax_error_is_refused(server: Redis, ledger: str) -> None:
    with pytest.raises(ResponseError, match="Error compiling script"):
        server.script_load(broken(ledger, BREAKS[ledger][1]))


@pytest.mark.parametrize(("ledger", "name"), SCRIPTS)
def test_luacheck_finds_nothing_in_each_script(ledger: str, name: str) -> None:
    result = luacheck(name, sent(ledger, name))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("ledger", list(LEDGERS))
def test_luacheck_finds_a_mistyped_name_and_a_syntax_error(ledger: str) -> None:
    name, no_end, typo, mistyped = BREAKS[ledger]
    found = luacheck(name, broken(ledger, typo))
    assert found.returncode == 1 and f"accessing undefined variable '{mistyped}'" in found.stdout, found.stdout
    syntax = luacheck(name, broken(ledger, no_end))
    assert syntax.returncode == 2 and "expected 'end'" in syntax.stdout, syntax.stdout
