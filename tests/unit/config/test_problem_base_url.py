"""`[server] problem_base_url`: the base of the `/v1` problem documents' `type` URIs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from adapters.inbound._shared.dialect import EdgeContext
from adapters.inbound._shared.problem import DEFAULT_PROBLEM_BASE
from adapters.inbound.openai.errors import ProblemRenderer
from adapters.inbound.responses.errors import ResponsesErrors
from config import ConfigError, load_config_text
from domain.errors import ModelNotFound, QueueFull

UPSTREAM = '[upstreams.a]\nurl = "http://a:80"\nmodels = ["m"]\n'


def base_of(value: str) -> str:
    return load_config_text(f"[server]\nproblem_base_url = {json.dumps(value)}\n" + UPSTREAM).server.problem_base_url


def test_the_default_is_todays_base_everywhere() -> None:
    assert load_config_text(UPSTREAM).server.problem_base_url == "https://api.riotpiao.com/problems/"
    assert DEFAULT_PROBLEM_BASE == "https://api.riotpiao.com/problems/"  # what a dialect built without bootstrap uses
    assert EdgeContext.__dataclass_fields__["problem_base_url"].default == DEFAULT_PROBLEM_BASE


@pytest.mark.parametrize(
    ("value", "base"),
    [
        ("https://errors.example.com/problems/", "https://errors.example.com/problems/"),
        ("https://errors.example.com/problems", "https://errors.example.com/problems/"),  # the '/' is added
        ("https://errors.example.com", "https://errors.example.com/"),
        ("http://10.0.0.1:8080/p/", "http://10.0.0.1:8080/p/"),
        ("https://[2001:db8::1]/problems/", "https://[2001:db8::1]/problems/"),
    ],
)
def test_an_absolute_http_url_is_taken_with_a_trailing_slash(value: str, base: str) -> None:
    assert base_of(value) == base


@pytest.mark.parametrize(
    "value",
    [
        "",
        "/problems/",  # relative
        "errors.example.com/problems/",  # no scheme
        "ftp://errors.example.com/problems/",
        "urn:problems:",
        "https:///problems/",  # no host
        "https://errors.example.com/problems/?v=1",
        "https://errors.example.com/problems/#kind",
        "https://errors.example.com/pro blems/",
        "https://errors.example.com:99999/problems/",
        "https://errors.example.com/probl\u00e8mes/",  # not ASCII: percent-encode it
        "https://user@errors.example.com/problems/",
    ],
)
def test_anything_else_stops_startup_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^server\.problem_base_url must be an absolute http\(s\) URL"):
        base_of(value)


def test_a_password_in_a_refused_base_is_not_repeated() -> None:
    with pytest.raises(ConfigError) as refused:
        base_of("https://user:hunter2@errors.example.com/problems/")
    assert "hunter2" not in str(refused.value)


def test_a_base_that_is_not_a_string_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"invalid value for 'server\.problem_base_url'"):
        load_config_text("[server]\nproblem_base_url = 3\n" + UPSTREAM)


def test_check_config_shows_the_normalised_base(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[server]\nproblem_base_url = "https://errors.example.com/p"\n' + UPSTREAM)
    done = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["server"]["problem_base_url"] == "https://errors.example.com/p/"


@pytest.mark.parametrize("renderer", [ProblemRenderer, ResponsesErrors])
def test_the_v1_renderers_prefix_the_kind_with_their_base(renderer: type[ProblemRenderer | ResponsesErrors]) -> None:
    for error in (ModelNotFound("gpt-9"), QueueFull(retry_after=2)):
        _, body, _, _ = renderer("https://errors.example.com/p/").render(error, "rid")
        assert msgspec.json.decode(body)["type"] == f"https://errors.example.com/p/{error.kind}"
        _, body, _, _ = renderer().render(error, "rid")
        assert msgspec.json.decode(body)["type"] == f"https://api.riotpiao.com/problems/{error.kind}"
