"""The replica-health keys of `[upstreams.NAME.endpoints]`: ejection, load metrics, affinity; documented
defaults, each mistake naming its key, and check-config printing them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from tests.unit.config.test_endpoints_config import ADMISSION, HEALTH_DEFAULTS, UPSTREAM, URLS, endpoints

from config import ConfigError, load_config_text
from domain.ejection import EjectionPolicy

E = r"upstreams\.a\.endpoints"


def test_defaults_are_the_issues_and_envoys() -> None:
    table = endpoints(URLS)
    assert {key: getattr(table, key) for key in HEALTH_DEFAULTS} == HEALTH_DEFAULTS
    assert table.ejection_policy() == EjectionPolicy()  # the domain's defaults are the same


def test_every_key_is_read() -> None:
    table = endpoints(URLS + "consecutive_failures = 3\nbase_ejection_seconds = 10\nmax_ejection_seconds = 60\n"
                      "max_ejection_percent = 100\nload_metrics = false\nload_metrics_interval_seconds = 0.5\n"
                      'affinity = "off"\naffinity_max_extra_in_flight = 0\n')  # fmt: skip
    assert table.ejection_policy() == EjectionPolicy(consecutive_failures=3, base_ejection_seconds=10,
                                                     max_ejection_seconds=60, max_ejection_percent=100)  # fmt: skip
    assert (table.load_metrics, table.load_metrics_interval_seconds) == (False, 0.5)
    assert (table.affinity, table.affinity_max_extra_in_flight) == ("off", 0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("consecutive_failures = 0", rf"invalid value for '{E}\.consecutive_failures'"),
        ("base_ejection_seconds = 0", rf"invalid value for '{E}\.base_ejection_seconds'"),
        ("max_ejection_seconds = -1", rf"invalid value for '{E}\.max_ejection_seconds'"),
        ("max_ejection_seconds = 10", rf"{E}\.max_ejection_seconds \(10\) must be at least base_ejection_seconds"),
        ("max_ejection_percent = 101", rf"invalid value for '{E}\.max_ejection_percent'"),
        ("max_ejection_percent = -1", rf"invalid value for '{E}\.max_ejection_percent'"),
        ('load_metrics = "yes"', rf"invalid value for '{E}\.load_metrics'"),
        ("load_metrics_interval_seconds = 0", rf"invalid value for '{E}\.load_metrics_interval_seconds'"),
        ('affinity = "on"', rf"invalid value for '{E}\.affinity'"),
        ("affinity_max_extra_in_flight = -1", rf"invalid value for '{E}\.affinity_max_extra_in_flight'"),
        ("affinity_max_extra = 1", rf"unknown key '{E}\.affinity_max_extra'"),
    ],
)
def test_mistakes_name_the_key(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config_text(UPSTREAM + ADMISSION + URLS + line + "\n")


def test_check_config_prints_them(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(UPSTREAM + ADMISSION + URLS + 'affinity = "off"\nmax_ejection_percent = 34\n')
    done = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = msgspec.json.decode(done.stdout)["upstreams"]["a"]["endpoints"]
    assert {key: shown[key] for key in HEALTH_DEFAULTS} == {**HEALTH_DEFAULTS, "affinity": "off",
                                                            "max_ejection_percent": 34}  # fmt: skip
