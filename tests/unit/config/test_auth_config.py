"""`[auth]`: off unless required; required needs a keys file; check-config shows it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_config_text

UPSTREAM = '[upstreams.a]\nurl = "http://a:80"\nmodels = ["m"]\n'


def test_auth_is_off_when_the_table_is_absent() -> None:
    auth = load_config_text(UPSTREAM).auth
    assert (auth.mode, auth.keys_file, auth.reload_interval_seconds) == ("off", None, 5.0)


def test_required_with_a_keys_file() -> None:
    auth = load_config_text(UPSTREAM + '[auth]\nmode = "required"\nkeys_file = "/k.toml"\n'
                            "reload_interval_seconds = 0.2\n").auth
    assert (auth.mode, auth.keys_file, auth.reload_interval_seconds) == ("required", "/k.toml", 0.2)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('mode = "required"\n', r"auth\.keys_file is required when auth\.mode = 'required'"),
        ('mode = "on"\n', r"invalid value for 'auth\.mode'"),
        ('mode = "off"\nreload_interval_seconds = 0\n', r"invalid value for 'auth\.reload_interval_seconds'"),
        ('mode = "off"\nkeysfile = "x"\n', r"unknown key 'auth\.keysfile'"),
    ],
)
def test_mistakes_name_the_key(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config_text(UPSTREAM + "[auth]\n" + table)


def test_check_config_prints_auth(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(UPSTREAM + '[auth]\nmode = "required"\nkeys_file = "/etc/gateway/keys/keys.toml"\n')
    done = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert '"mode": "required"' in done.stdout and '"keys_file": "/etc/gateway/keys/keys.toml"' in done.stdout
    assert '"reload_interval_seconds": 5.0' in done.stdout
