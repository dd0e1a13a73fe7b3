"""Configuration: every mistake stops startup with a message naming the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_config_text

DESIGN_EXAMPLE = """
[server]
listen = "127.0.0.1:8080"

[upstreams.reasoning]
url = "http://reasoning-predictor.llm-serving:80"
models = ["reasoning"]
[upstreams.reasoning.admission]
sequence_slots = 8
max_in_flight = 6
queue_depth = 8
queue_timeout_seconds = 30

[upstreams.qwen]
url = "http://qwen-predictor.llm-serving:80"
models = ["qwen2.5:3b-instruct"]
"""

UPSTREAM = '[upstreams.a]\nurl = "http://a:80"\nmodels = ["m"]\n'
ADMISSION = (
    "[upstreams.a.admission]\nsequence_slots = 8\nmax_in_flight = 6\nqueue_depth = 8\nqueue_timeout_seconds = 30\n"
)


def test_design_example_is_complete() -> None:
    config = load_config_text(DESIGN_EXAMPLE)
    table = config.upstreams["reasoning"].admission
    assert table is not None and (table.max_in_flight, table.queue_depth) == (6, 8)
    assert config.upstreams["qwen"].admission is None
    assert config.server.listen == "127.0.0.1:8080"
    assert config.upstreams["qwen"].connect_timeout_seconds > 0  # documented default
    assert config.server.limit_concurrency == 4096  # documented default (docs/operations.md)


def test_client_connection_and_waiting_keys_have_documented_defaults() -> None:
    config = load_config_text(UPSTREAM)
    assert config.server.client_write_timeout_seconds == 30.0
    assert config.server.keep_alive_timeout_seconds == 75  # what uvicorn was given before it was a key
    assert config.auth.max_waiting_per_consumer == 64
    tuned = load_config_text("[server]\nclient_write_timeout_seconds = 2.5\nkeep_alive_timeout_seconds = 5\n"
                             "[auth]\nmax_waiting_per_consumer = 0\n" + UPSTREAM)
    assert (tuned.server.client_write_timeout_seconds, tuned.server.keep_alive_timeout_seconds) == (2.5, 5)
    assert tuned.auth.max_waiting_per_consumer == 0


def test_fairness_keys_reach_the_policy() -> None:
    from wiring.admission import policies

    config = load_config_text(UPSTREAM + ADMISSION + 'fairness = "fair"\nmax_queued_per_consumer = 4\n')
    policy = policies(config)["a"]
    assert policy is not None and (policy.fairness, policy.max_queued_per_consumer) == ("fair", 4)
    default = policies(load_config_text(UPSTREAM + ADMISSION))["a"]
    assert default is not None and (default.fairness, default.max_queued_per_consumer) == ("fifo", None)


def test_output_token_weight_defaults_to_2() -> None:
    default = load_config_text(UPSTREAM + ADMISSION).upstreams["a"].admission
    tuned = load_config_text(UPSTREAM + ADMISSION + "output_token_weight = 3.5\n").upstreams["a"].admission
    assert default is not None and tuned is not None
    assert (default.output_token_weight, tuned.output_token_weight) == (2.0, 3.5)


@pytest.mark.parametrize("missing", ["sequence_slots", "max_in_flight", "queue_depth", "queue_timeout_seconds"])
def test_admission_keys_have_no_defaults(missing: str) -> None:
    admission = "\n".join(line for line in ADMISSION.splitlines() if not line.startswith(missing))
    with pytest.raises(ConfigError, match=rf"missing required key 'upstreams\.a\.admission\.{missing}'"):
        load_config_text(UPSTREAM + admission)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (UPSTREAM + ADMISSION.replace("max_in_flight = 6", "max_in_flight = 8"),
         r"upstreams\.a\.admission\.max_in_flight \(8\) must be below sequence_slots \(8\)"),
        (UPSTREAM + ADMISSION.replace("max_in_flight = 6", 'max_in_flight = "6"'),
         r"invalid value for 'upstreams\.a\.admission\.max_in_flight'"),
        (UPSTREAM + ADMISSION.replace("queue_depth = 8", "queue_depth = -1"),
         r"invalid value for 'upstreams\.a\.admission\.queue_depth'"),
        (UPSTREAM + ADMISSION.replace("queue_timeout_seconds = 30", "queue_timeout_seconds = 0"),
         r"invalid value for 'upstreams\.a\.admission\.queue_timeout_seconds'"),
        (UPSTREAM + "typo = 1\n", r"unknown key 'upstreams\.a\.typo'"),
        ('[server]\nlisen = "x"\n' + UPSTREAM, r"unknown key 'server\.lisen'"),
        ('[server]\nlisten = "nope"\n' + UPSTREAM, r"server\.listen must be HOST:PORT"),
        ("[server]\nlimit_concurrency = 0\n" + UPSTREAM, r"invalid value for 'server\.limit_concurrency'"),
        ("[server]\nclient_write_timeout_seconds = 0\n" + UPSTREAM,
         r"invalid value for 'server\.client_write_timeout_seconds'"),
        ("[server]\nkeep_alive_timeout_seconds = 0\n" + UPSTREAM,
         r"invalid value for 'server\.keep_alive_timeout_seconds'"),
        ("[auth]\nmax_waiting_per_consumer = -1\n" + UPSTREAM, r"invalid value for 'auth\.max_waiting_per_consumer'"),
        (UPSTREAM.replace('models = ["m"]', "models = []"), r"invalid value for 'upstreams\.a\.models'"),
        (UPSTREAM.replace("http://a:80", "ftp://a"), r"upstreams\.a\.url must be an http\(s\) URL"),
        (UPSTREAM + '[upstreams.b]\nurl = "http://A"\nmodels = ["n"]\n', r"upstreams\.b\.url: .*same address"),
        (UPSTREAM + '[upstreams.b]\nurl = "http://b"\nmodels = ["m"]\n', r"model 'm' is already served"),
        ("", r"missing required table 'upstreams'"),
        ("[upstreams", r"not valid TOML"),
        ('[server]\nworkers = 2\n' + UPSTREAM, r"server\.workers > 1 needs admission\.backend = 'redis'"),
        ('[admission]\nbackend = "redis"\n' + UPSTREAM, r"admission\.redis_url is required"),
        ('[admission]\nbackend = "etcd"\n' + UPSTREAM, r"invalid value for 'admission\.backend'"),
        ('[admission]\nbackend = "redis"\nredis_url = "redis://r"\nredis_sentinels = ["s:26379"]\n'
         'redis_sentinel_master = "m"\n' + UPSTREAM,
         r"admission\.redis_url and admission\.redis_sentinels: set exactly one"),
        ('[admission]\nbackend = "redis"\nredis_sentinels = ["s:26379"]\n' + UPSTREAM,
         r"admission\.redis_sentinel_master is required"),
        ('[admission]\nbackend = "redis"\nredis_sentinels = []\nredis_sentinel_master = "m"\n' + UPSTREAM,
         r"admission\.redis_sentinels must list"),
        ('[admission]\nbackend = "redis"\nredis_sentinels = ["s"]\nredis_sentinel_master = "m"\n' + UPSTREAM,
         r"admission\.redis_sentinels\[0\] must be HOST:PORT"),
        ('[admission]\nbackend = "redis"\nredis_url = "redis://r"\nredis_sentinel_master = "m"\n' + UPSTREAM,
         r"admission\.redis_sentinel_master is only used with admission\.redis_sentinels"),
        ('[admission]\nbackend = "redis"\nredis_sentinels = ["s:1"]\nredis_sentinel_master = "m"\n'
         "redis_cluster = true\n" + UPSTREAM, r"admission\.redis_cluster needs admission\.redis_url"),
        ('[admission]\nbackend = "redis"\nredis_url = "redis://r"\nredis_cluster = true\nkey_prefix = "{g}"\n'
         + UPSTREAM, r"admission\.key_prefix must not contain"),
        ('[ops]\nlisten = "nope"\n' + UPSTREAM, r"ops\.listen must be HOST:PORT"),
        ('[ops]\nlisten = "127.0.0.1:8080"\n' + UPSTREAM, r"ops\.listen must differ from server\.listen"),
        ('[ops]\nlisen = "x"\n' + UPSTREAM, r"unknown key 'ops\.lisen'"),
        (UPSTREAM + ADMISSION + 'fairness = "wfq"\n', r"invalid value for 'upstreams\.a\.admission\.fairness'"),
        (UPSTREAM + ADMISSION + "max_queued_per_consumer = 0\n",
         r"invalid value for 'upstreams\.a\.admission\.max_queued_per_consumer'"),
        (UPSTREAM + ADMISSION + "output_token_weight = 0\n",
         r"invalid value for 'upstreams\.a\.admission\.output_token_weight'"),
        (UPSTREAM + 'aliases = [""]\n', r"invalid value for 'upstreams\.a\.aliases\[0\]'"),
        (UPSTREAM + 'aliases = ["claude-*"]\n[upstreams.b]\nurl = "http://b"\nmodels = ["n"]\naliases = ["*-sonnet"]\n',
         r"upstreams\.a\.aliases: pattern 'claude-\*' and upstreams\.b\.aliases pattern '\*-sonnet' can both "
         r"match 'claude-sonnet'"),
        (UPSTREAM + 'aliases = ["claude-*"]\n[upstreams.b]\nurl = "http://b"\nmodels = ["claude-x"]\n',
         r"upstreams\.a\.aliases: pattern 'claude-\*' matches model 'claude-x' of upstreams\.b\.models"),
    ],
)
def test_mistakes_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config_text(text)


def test_redis_sentinels_cluster_and_ops_defaults() -> None:
    sentinel = load_config_text('[admission]\nbackend = "redis"\nredis_sentinels = ["a:26379", "b:26380"]\n'
                                'redis_sentinel_master = "gateway"\n' + UPSTREAM)
    assert sentinel.admission.redis_sentinels == ["a:26379", "b:26380"]
    assert sentinel.admission.redis_url is None and not sentinel.admission.redis_cluster
    cluster = load_config_text('[admission]\nbackend = "redis"\nredis_url = "redis://n1:7000"\nredis_cluster = true\n'
                               + UPSTREAM)
    assert cluster.admission.redis_cluster
    assert load_config_text(UPSTREAM).ops.listen == "127.0.0.1:9464"
    assert load_config_text('[ops]\nlisten = "127.0.0.1:0"\n' + UPSTREAM).ops.listen == "127.0.0.1:0"


def test_check_config_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`gateway check-config ... | head` used to end in a BrokenPipeError traceback."""
    big = tmp_path / "big.toml"  # an effective config far larger than a pipe's buffer
    big.write_text("".join(f'[upstreams.u{i}]\nurl = "http://u{i}:80"\nmodels = ["m{i}"]\n' for i in range(600)))
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -m cli check-config --config {big} | head -n 2"],
        capture_output=True, text=True, check=False, timeout=60)
    assert done.stdout.splitlines()[0] == "{", done.stdout[:200]
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr


def test_check_config_cli(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(DESIGN_EXAMPLE)
    ok = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(good)],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert '"max_in_flight": 6' in ok.stdout and '"connect_timeout_seconds"' in ok.stdout
    assert '"fairness": "fifo"' in ok.stdout and '"max_queued_per_consumer": null' in ok.stdout  # defaults shown
    assert '"output_token_weight": 2.0' in ok.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(UPSTREAM + ADMISSION.replace("queue_depth = 8\n", ""))
    failed = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(bad)],
                            capture_output=True, text=True, check=False)
    assert failed.returncode == 2
    assert "upstreams.a.admission.queue_depth" in failed.stderr
    clash = tmp_path / "clash.toml"
    clash.write_text(DESIGN_EXAMPLE.replace('models = ["reasoning"]', 'models = ["reasoning"]\naliases = ["claude-*"]')
                     + 'aliases = ["claude-haiku-*"]\n')
    clashed = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(clash)],
                             capture_output=True, text=True, check=False)
    assert clashed.returncode == 2
    assert "upstreams.reasoning.aliases" in clashed.stderr and "upstreams.qwen.aliases" in clashed.stderr
    missing = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(tmp_path / "no")],
                             capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr


def test_reasoning_is_auto_unless_told() -> None:
    assert load_config_text(UPSTREAM).upstreams["a"].reasoning == "auto"
    for value, parsed in (("true", True), ("false", False), ('"auto"', "auto")):
        assert load_config_text(UPSTREAM + f"reasoning = {value}\n").upstreams["a"].reasoning == parsed


@pytest.mark.parametrize("value", ['"yes"', '"true"', "1", '"off"'])
def test_a_bad_reasoning_value_names_the_key(value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"invalid value for 'upstreams\.a\.reasoning'"):
        load_config_text(UPSTREAM + f"reasoning = {value}\n")
    path = tmp_path / "bad.toml"
    path.write_text(UPSTREAM + f"reasoning = {value}\n")
    failed = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert failed.returncode == 2 and "upstreams.a.reasoning" in failed.stderr


def test_check_config_prints_each_upstreams_reasoning(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(DESIGN_EXAMPLE.replace('models = ["qwen2.5:3b-instruct"]',
                                           'models = ["qwen2.5:3b-instruct"]\nreasoning = false'))  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["upstreams"]
    assert (shown["reasoning"]["reasoning"], shown["qwen"]["reasoning"]) == ("auto", False)


def test_tokens_fairness_and_its_output_weight_reach_the_policy() -> None:
    from wiring.admission import policies

    config = load_config_text(UPSTREAM + ADMISSION + 'fairness = "tokens"\noutput_token_weight = 3.5\n')
    policy = policies(config)["a"]
    assert policy is not None and (policy.fairness, policy.output_token_weight) == ("tokens", 3.5)


def test_tokens_fairness_is_taken_with_the_redis_ledger() -> None:
    config = load_config_text('[admission]\nbackend = "redis"\nredis_url = "redis://r"\n' + UPSTREAM + ADMISSION
                              + 'fairness = "tokens"\n')
    assert config.admission.backend == "redis" and config.upstreams["a"].admission.fairness == "tokens"  # type: ignore[union-attr]
