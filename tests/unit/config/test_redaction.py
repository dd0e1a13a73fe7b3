"""`gateway check-config` prints no secret: passwords in URLs and keys named like secrets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_config_text
from redaction import masked_url, redacted, secret_name

SECRET_CONFIG = """
[admission]
backend = "redis"
redis_url = "redis://:hunter2@gateway-redis:6379/0"

[telemetry]
otlp_endpoint = "https://collector:s3cret-otlp@otel.example:4318"

[upstreams.a]
url = "https://svc:upstream-pass@a.example:443"
models = ["m"]
max_output_tokens = 4096
"""


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@gateway-redis:6379/0", "redis://:***@gateway-redis:6379/0"),
        ("redis://default:hunter2@gateway-redis:6379", "redis://default:***@gateway-redis:6379"),
        ("https://only-a-token@otel.example:4318", "https://***@otel.example:4318"),
        ("rediss://r:6380/0?password=hunter2&ssl_cert_reqs=none", "rediss://r:6380/0?password=***&ssl_cert_reqs=none"),
        ("http://reasoning-predictor.llm-serving:80", "http://reasoning-predictor.llm-serving:80"),
        ("0.0.0.0:8080", "0.0.0.0:8080"),
        ("not a url", "not a url"),
    ],
)
def test_urls_keep_everything_but_their_secrets(url: str, shown: str) -> None:
    assert masked_url(url) == shown


def test_keys_named_like_secrets_are_masked_whatever_their_value() -> None:
    data = {"password": "p", "api_key": "k", "x-api-key": "k", "otlp_headers": {"authorization": "Bearer x"},
            "token": ["t"], "client_secret": 3, "max_output_tokens": 4096, "key_prefix": "gateway",
            "keys_file": "/etc/keys.toml", "auth": {"mode": "required"}, "secret": None}
    assert redacted(data) == {
        "password": "***", "api_key": "***", "x-api-key": "***", "otlp_headers": "***", "token": "***",
        "client_secret": "***", "max_output_tokens": 4096, "key_prefix": "gateway", "keys_file": "/etc/keys.toml",
        "auth": {"mode": "required"}, "secret": None,  # unset stays visibly unset
    }
    assert not secret_name("tokens_per_minute") and secret_name("secret_key")
    assert not secret_name("output_token_weight") and secret_name("token_secret")


def test_check_config_masks_every_password(tmp_path: Path) -> None:
    path = tmp_path / "secret.toml"
    path.write_text(SECRET_CONFIG)
    shown = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                           capture_output=True, text=True, check=False)
    assert shown.returncode == 0, shown.stderr
    for secret in ("hunter2", "s3cret-otlp", "upstream-pass"):
        assert secret not in shown.stdout
    config = json.loads(shown.stdout)
    assert config["admission"]["redis_url"] == "redis://:***@gateway-redis:6379/0"
    assert config["telemetry"]["otlp_endpoint"] == "https://collector:***@otel.example:4318"
    assert config["upstreams"]["a"]["url"] == "https://svc:***@a.example:443"
    assert config["upstreams"]["a"]["max_output_tokens"] == 4096


def test_a_config_error_quoting_a_url_masks_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text('[upstreams.a]\nurl = "ftp://u:hunter2@a"\nmodels = ["m"]\n')
    assert "hunter2" not in str(caught.value) and "ftp://u:***@a" in str(caught.value)
