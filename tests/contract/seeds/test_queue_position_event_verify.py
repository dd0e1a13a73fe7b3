"""The queue position event task card's Verify section (shared/seeds), run as written against real processes.

cap = 2 on `reasoning` against a stub holding each request 3 s; `qwen2.5:3b-instruct`
is an uncapped upstream. The gateway listens on localhost:8080 as the seed says.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
from tests.support.processes import Processes, upstream_toml
from tests.support.seeds import seed_gateway_port, seed_shell

FILL = """seq 4 | xargs -P4 -I{} curl -s -o /dev/null -X POST localhost:8080/llm/v1/messages \\
  -H 'content-type: application/json' \\
  -d '{"model":"reasoning","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}' &
"""

QUEUED = """curl -N -s localhost:8080/llm/v1/messages -H 'content-type: application/json' \\
  -d '{"model":"reasoning","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}' \\
  | grep -m3 '^event:'"""

UNCONTENDED = """curl -N -s localhost:8080/llm/v1/messages -H 'content-type: application/json' \\
  -d '{"model":"qwen2.5:3b-instruct","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}' \\
  | head -1"""


@pytest.fixture
def seed_gateway(procs: Processes) -> int:
    reasoning, qwen = procs.together([partial(procs.stub, "--hold", "3"), procs.stub])
    port = seed_gateway_port()
    procs.gateway(
        upstream_toml("reasoning", reasoning.url, ["reasoning"], {
            "sequence_slots": 3, "max_in_flight": 2, "queue_depth": 8, "queue_timeout_seconds": 30,
        })
        + upstream_toml("qwen", qwen.url, ["qwen2.5:3b-instruct"]),
        port=port,
    )
    return port


def assert_queue_frames_come_first(lines: list[str]) -> None:
    """The seed's expectation for `grep -m3 '^event:'`: queue frames, then message_start.

    The probe is third in line, so it may see one queue frame per position (3, 2, 1)
    and use up grep's three lines before its message_start; what must hold is that it
    starts queued and that no queue frame follows a message_start.
    """
    assert len(lines) == 3, lines
    assert lines[0] == "event: queue", lines
    started = lines.index("event: message_start") if "event: message_start" in lines else len(lines)
    assert all(line == "event: queue" for line in lines[:started]), lines
    assert "event: queue" not in lines[started:], lines


def test_queued_stream_sees_queue_event_first(seed_gateway: int) -> None:
    out = seed_shell(FILL + "\nsleep 1\n" + QUEUED + "\nwait", seed_gateway)
    # expected: event: queue arrives before any event: message_start
    assert_queue_frames_come_first(out.stdout.splitlines())


def test_queue_event_arrives_within_a_second(seed_gateway: int) -> None:
    """The seed's probe, timed: its first line must arrive within a second.

    grep only flushes per line when writing to a terminal (as in the seed, run by
    hand), so the probe runs with its stdout on a pseudo-terminal.
    """
    import os
    import pty
    import select
    import subprocess

    fill = subprocess.Popen(["bash", "-c", FILL.replace("localhost:8080", f"localhost:{seed_gateway}") + "wait"])
    try:
        time.sleep(1)
        leader, follower = pty.openpty()
        probe = subprocess.Popen(["bash", "-c", QUEUED.replace("localhost:8080", f"localhost:{seed_gateway}")],
                                 stdout=follower, stderr=subprocess.DEVNULL)
        os.close(follower)
        started = time.monotonic()
        ready, _, _ = select.select([leader], [], [], 5.0)
        first_at = time.monotonic() - started
        assert ready, "no output within 5 s"
        output = b""
        while True:
            ready, _, _ = select.select([leader], [], [], 15.0)
            if not ready:
                break
            try:
                data = os.read(leader, 4096)
            except OSError:
                break
            if not data:
                break
            output += data
        probe.wait(timeout=30)
        os.close(leader)
        lines = output.decode().replace("\r", "").splitlines()
        assert_queue_frames_come_first(lines)
        assert first_at < 1.0, first_at
    finally:
        fill.wait(timeout=30)


def test_uncontended_upstream_starts_with_message_start(seed_gateway: int) -> None:
    out = seed_shell(UNCONTENDED, seed_gateway)
    assert out.stdout.strip() == "event: message_start", out.stdout
