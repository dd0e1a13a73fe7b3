"""`[upstreams.NAME.endpoints]`: urls XOR dns, the per-replica slots, every error naming its key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from config import ConfigError, EndpointsTable, load_config_text, nameserver

UPSTREAM = '[upstreams.a]\nurl = "http://a:80"\nmodels = ["m"]\n'
ADMISSION = (
    "[upstreams.a.admission]\nsequence_slots = 8\nmax_in_flight = 6\nqueue_depth = 8\nqueue_timeout_seconds = 30\n"
)
SLOTS = "sequence_slots = 4\nmax_in_flight = 4\n"
URLS = '[upstreams.a.endpoints]\nurls = ["http://10.42.0.17:8080", "http://10.42.1.9:8080"]\n' + SLOTS
HEADLESS = "reasoning-predictor-headless.llm-serving.svc.cluster.local"
DNS = f'[upstreams.a.endpoints]\ndns = "{HEADLESS}"\nport = 8080\n' + SLOTS


HEALTH_DEFAULTS = {  # the replica-health keys, with their documented defaults
    "consecutive_failures": 5, "base_ejection_seconds": 30.0, "max_ejection_seconds": 300.0,
    "max_ejection_percent": 50, "load_metrics": True, "load_metrics_interval_seconds": 1.0, "affinity": "prefix",
    "affinity_max_extra_in_flight": 1, "resume": "tokens", "max_resumes": 2,
}  # fmt: skip


def endpoints(text: str) -> EndpointsTable:
    table = load_config_text(UPSTREAM + ADMISSION + text).upstreams["a"].endpoints
    assert table is not None
    return table


def test_the_issue_examples_and_their_defaults() -> None:
    fixed = endpoints(URLS)
    assert fixed.replica_urls() == ["http://10.42.0.17:8080", "http://10.42.1.9:8080"]
    assert (fixed.sequence_slots, fixed.max_in_flight) == (4, 4)
    assert msgspec.UNSET in (fixed.dns, fixed.port, fixed.scheme, fixed.refresh_seconds, fixed.nameservers)
    dns = endpoints(DNS)
    assert (dns.dns, dns.port, dns.scheme, dns.refresh_seconds, dns.nameservers) == (
        "reasoning-predictor-headless.llm-serving.svc.cluster.local", 8080, "http", 5.0, [],
    )
    full = endpoints(DNS + 'scheme = "https"\nrefresh_seconds = 1.5\nnameservers = ["127.0.0.1:5353", "10.96.0.10"]\n')
    assert (full.scheme, full.refresh_seconds, full.nameservers) == ("https", 1.5, ["127.0.0.1:5353", "10.96.0.10"])
    assert load_config_text(UPSTREAM + ADMISSION).upstreams["a"].endpoints is None  # absent: today's behaviour


def test_urls_are_normalised_to_server_roots() -> None:
    urls = 'urls = ["http://Replica-1/", "https://r2", "http://[::1]:9000"]\n'
    table = endpoints("[upstreams.a.endpoints]\n" + urls + SLOTS)
    assert table.replica_urls() == ["http://replica-1:80", "https://r2:443", "http://[::1]:9000"]


def test_nameservers_parse_host_and_port() -> None:
    assert nameserver("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert nameserver("10.96.0.10") == ("10.96.0.10", 53)
    assert nameserver("[::1]:5353") == ("::1", 5353) and nameserver("::1") == ("::1", 53)
    assert nameserver("[fd00::a]") == ("fd00::a", 53)


E = r"upstreams\.a\.endpoints"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[upstreams.a.endpoints]\n" + SLOTS, rf"exactly one of '{E}\.urls' or '{E}\.dns' is required"),
        (URLS + 'dns = "x.local"\nport = 1\n', rf"exactly one of '{E}\.urls' or '{E}\.dns'"),
        (DNS.replace("port = 8080\n", ""), rf"missing required key '{E}\.port'"),
        (URLS.replace("sequence_slots = 4\n", ""), rf"missing required key '{E}\.sequence_slots'"),
        (URLS.replace("max_in_flight = 4\n", ""), rf"missing required key '{E}\.max_in_flight'"),
        (URLS.replace("max_in_flight = 4", "max_in_flight = 5"), rf"{E}\.max_in_flight \(5\) must be at most "
                                                                  r"sequence_slots \(4\)"),
        (URLS.replace("max_in_flight = 4", "max_in_flight = 0"), rf"invalid value for '{E}\.max_in_flight'"),
        (URLS + "port = 8080\n", rf"{E}\.port applies only with '{E}\.dns'"),
        (URLS + 'scheme = "https"\n', rf"{E}\.scheme applies only with '{E}\.dns'"),
        (URLS + "refresh_seconds = 1\n", rf"{E}\.refresh_seconds applies only with"),
        (URLS + 'nameservers = ["127.0.0.1"]\n', rf"{E}\.nameservers applies only with"),
        (URLS.replace('urls = ["http://10.42.0.17:8080", "http://10.42.1.9:8080"]', "urls = []"),
         rf"invalid value for '{E}\.urls'"),
        (URLS.replace("http://10.42.1.9:8080", "ftp://x"), rf"{E}\.urls\[1\] must be an http\(s\) URL"),
        (URLS.replace("http://10.42.1.9:8080", "http://x:8080/v1"), rf"{E}\.urls\[1\] must be an http\(s\) URL"),
        (URLS.replace("http://10.42.1.9:8080", "http://x:99999"), rf"{E}\.urls\[1\] must be an http\(s\) URL"),
        (URLS.replace("http://10.42.1.9:8080", "http://10.42.0.17:8080/"), rf"{E}\.urls\[1\]: replica "
                                                                           r"http://10\.42\.0\.17:8080 is already"),
        (DNS + "port = 0\n", r"not valid TOML"),  # a key given twice
        (DNS.replace("port = 8080", "port = 0"), rf"invalid value for '{E}\.port'"),
        (DNS.replace("port = 8080", "port = 70000"), rf"invalid value for '{E}\.port'"),
        (DNS + 'scheme = "ftp"\n', rf"invalid value for '{E}\.scheme'"),
        (DNS + "refresh_seconds = 0\n", rf"invalid value for '{E}\.refresh_seconds'"),
        (DNS + 'nameservers = ["dns.google"]\n', rf"{E}\.nameservers\[0\] must be HOST\[:PORT\]"),
        (DNS + 'nameservers = ["127.0.0.1:0"]\n', rf"{E}\.nameservers\[0\] must be HOST\[:PORT\]"),
        (DNS + 'nameservers = ["[::1"]\n', rf"{E}\.nameservers\[0\] must be HOST\[:PORT\]"),
        (DNS.replace("reasoning-predictor-headless.llm-serving.svc.cluster.local", "http://x"),
         rf"{E}\.dns must be a DNS name"),
        (DNS.replace("reasoning-predictor-headless.llm-serving.svc.cluster.local", "10.0.0.1"),
         rf"{E}\.dns must be a DNS name"),
        (URLS + "typo = 1\n", rf"unknown key '{E}\.typo'"),
    ],
)
def test_mistakes_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config_text(UPSTREAM + ADMISSION + text)


def test_admission_is_required_with_endpoints() -> None:
    with pytest.raises(ConfigError, match=r"upstreams\.a\.admission is required when upstreams\.a\.endpoints"):
        load_config_text(UPSTREAM + URLS)


def test_a_replica_belongs_to_one_upstream() -> None:
    other = ('[upstreams.b]\nurl = "http://b:80"\nmodels = ["n"]\n' + ADMISSION.replace(".a.", ".b.")
             + '[upstreams.b.endpoints]\nurls = ["http://10.42.1.9:8080"]\n' + SLOTS)  # fmt: skip
    with pytest.raises(ConfigError, match=r"upstreams\.b\.endpoints\.urls\[0\]: .* already listed by upstreams\.a"):
        load_config_text(UPSTREAM + ADMISSION + URLS + other)


def test_check_config_prints_the_endpoint_settings(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(UPSTREAM + ADMISSION + DNS)
    done = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = msgspec.json.decode(done.stdout)["upstreams"]["a"]["endpoints"]
    assert shown == {"sequence_slots": 4, "max_in_flight": 4, "port": 8080, "scheme": "http", "refresh_seconds": 5.0,
                     "nameservers": [], "dns": HEADLESS, **HEALTH_DEFAULTS}  # fmt: skip
    path.write_text(UPSTREAM + ADMISSION + URLS.replace("max_in_flight = 4", "max_in_flight = 9"))
    failed = subprocess.run([sys.executable, "-m", "cli", "check-config", "--config", str(path)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert failed.returncode == 2 and "upstreams.a.endpoints.max_in_flight" in failed.stderr
