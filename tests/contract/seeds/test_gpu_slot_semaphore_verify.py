"""The GPU slot semaphore task card's Verify section (shared/seeds), run as written: curl + xargs,
against real processes.

The stub holds each answer 2 s and logs to /tmp/stub-reasoning.log; the gateway
listens on localhost:8080 (the port the card names) with cap 6 and queue 8.
"""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path

import pytest
from tests.support.metrics import gauge, samples
from tests.support.processes import Processes, upstream_toml
from tests.support.seeds import seed_gateway_port, seed_shell

LOG = Path("/tmp/stub-reasoning.log")

FIRE_40 = """seq 40 | xargs -P40 -I{} curl -s -o /dev/null -w '%{http_code}\\n' \\
  -X POST localhost:8080/v1/chat/completions \\
  -H 'content-type: application/json' -d '{"model":"reasoning","messages":[]}' | sort | uniq -c"""

GREP_7 = "grep -c 'max_concurrent=7' /tmp/stub-reasoning.log"

RETRY_AFTER = """curl -s -D - -o /dev/null -X POST localhost:8080/v1/chat/completions \\
  -H 'content-type: application/json' -d '{"model":"reasoning","messages":[]}' | grep -i retry-after"""

SPLIT = """seq 20 | xargs -P20 -I{} curl -s -o /dev/null -X POST localhost:8080/v1/chat/completions \\
  -H 'content-type: application/json' -d '{"model":"reasoning","messages":[]}' &
seq 20 | xargs -P20 -I{} curl -s -o /dev/null -X POST localhost:8080/llm/v1/messages \\
  -H 'content-type: application/json' \\
  -d '{"model":"reasoning","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}' &
wait
grep -c 'max_concurrent=7' /tmp/stub-reasoning.log"""


@pytest.fixture
def seed_gateway(procs: Processes) -> int:
    stub = procs.stub("--hold", "2", log=LOG)
    port = seed_gateway_port()
    return procs.gateway(
        upstream_toml("reasoning", stub.url, ["reasoning"], {
            "sequence_slots": 8, "max_in_flight": 6, "queue_depth": 8, "queue_timeout_seconds": 30,
        }),
        port=port,
    ).port


@pytest.fixture
def ops_url(procs: Processes, seed_gateway: int) -> str:
    return procs.procs[-1].ops_url


def _counts(output: str) -> dict[str, int]:
    counts: dict[str, int] = collections.Counter()
    for line in output.splitlines():
        number, code = line.split()
        counts[code] += int(number)
    return counts


def test_forty_concurrent_requests(seed_gateway: int) -> None:
    counts = _counts(seed_shell(FIRE_40, seed_gateway).stdout)
    # "a mix of 200 and 503; zero 500s": 6 admitted + 8 queued are served, 26 rejected.
    assert set(counts) == {"200", "503"}, counts
    assert counts["200"] == 14 and counts["503"] == 26, counts
    assert seed_shell(GREP_7, seed_gateway).stdout.strip() == "0"
    assert "max_concurrent=6" in LOG.read_text()


def test_rejected_request_carries_retry_after(seed_gateway: int, ops_url: str) -> None:
    # Saturate (6 in flight, 8 queued), then the seed's probe is the 15th and is rejected.
    fill = subprocess.Popen(
        ["bash", "-c", "seq 14 | xargs -P14 -I{} curl -s -o /dev/null -X POST "
         f"localhost:{seed_gateway}/v1/chat/completions -H 'content-type: application/json' "
         "-d '{\"model\":\"reasoning\",\"messages\":[]}'"])
    try:
        _wait_for_queue(ops_url, 8)
        out = seed_shell(RETRY_AFTER, seed_gateway).stdout
        assert out.lower().startswith("retry-after:"), out
        assert int(out.split(":")[1]) >= 1
    finally:
        fill.wait(timeout=30)


def test_both_surfaces_share_one_cap(seed_gateway: int) -> None:
    assert seed_shell(SPLIT, seed_gateway).stdout.strip().splitlines()[-1] == "0"
    text = LOG.read_text()
    assert "max_concurrent=6" in text and "max_concurrent=7" not in text


def _wait_for_queue(ops_url: str, depth: int, timeout: float = 10.0) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{ops_url}/metrics") as response:
            page = samples(response.read().decode())
        if (gauge(page, "gateway_upstream_queue_depth", "reasoning") or 0) >= depth:
            return
        time.sleep(0.05)
    raise AssertionError(f"queue never reached {depth}")
