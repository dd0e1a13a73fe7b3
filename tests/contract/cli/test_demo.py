"""The embedded demo (`gateway serve` without `--config`, and `scripts/run`): two stub upstreams
started as child processes, which stop with the gateway however it stops.

Each gateway is started in a session of its own, so its process group holds it and its
stubs, and only them: after it exits, the group must be empty (`/proc/*/stat`). The ports are
free ones (`--port`, `--ops-port`), or ports the test holds itself; the defaults (8080, 9464)
are only ever held by the test for the gateway to find taken, never served on.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest
from tests.contract.cli.held_port import held_port
from tests.support.processes import ROOT, free_port, wait_http

GATEWAY = str(Path(sys.executable).with_name("gateway"))  # the console script of this environment
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
CHAT = {"model": "qwen2.5:3b-instruct", "messages": [{"role": "user", "content": "hi"}]}


def _group(pgid: int) -> list[str]:
    """The command lines of the live processes in process group `pgid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        state, _, group = text[text.rindex(")") + 2:].split()[:3]
        if int(group) == pgid and state != "Z":
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace").strip())
    return found


@contextmanager
def _session(argv: list[str], output: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` as the leader of a new session; whatever of its group is left at the end is killed
    (the test has failed by then: it asserts the group is empty)."""
    with output.open("wb") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV,
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _run_to_exit(argv: list[str], output: Path) -> tuple[int, list[str]]:
    """Run until it exits: its status and the processes of its group still alive then."""
    with _session(argv, output) as proc:
        code = proc.wait(timeout=60)
        return code, _group(proc.pid)


@contextmanager
def _holding(port: int) -> Iterator[None]:
    """Listen on 127.0.0.1:`port` for the block, if it is free; if it is taken already, it stays
    taken for the block all the same (someone else's listener)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        except OSError as error:
            assert error.errno == errno.EADDRINUSE, error
        yield



def _refused(output: Path, key: str, address: str) -> None:
    """The last line is the one naming the taken address."""
    last = output.read_text().splitlines()[-1]
    assert last == f"gateway: configuration error: {key} = '{address}': cannot listen there (Address already in use)"


@pytest.mark.parametrize("which", ["server", "ops"])
def test_a_taken_port_stops_the_demo_and_its_stubs(tmp_path: Path, which: str) -> None:
    output = tmp_path / "gateway.out"
    with held_port() as taken:
        port, ops_port = (taken, free_port()) if which == "server" else (free_port(), taken)
        code, left = _run_to_exit([GATEWAY, "serve", "--port", str(port), "--ops-port", str(ops_port)], output)
    assert "stub listening" in output.read_text()  # the stubs had started
    assert code == 2 and left == [], output.read_text()
    _refused(output, f"[{which}] listen", f"127.0.0.1:{taken}")


def test_the_demo_on_its_default_ports_taken_stops_with_its_stubs(tmp_path: Path) -> None:
    """8080 taken: refused; 8080 free (another port given) and 9464 taken: refused."""
    output = tmp_path / "gateway.out"
    with _holding(8080):
        code, left = _run_to_exit([GATEWAY, "serve"], output)
    assert code == 2 and left == [], output.read_text()
    _refused(output, "[server] listen", "127.0.0.1:8080")
    with _holding(9464):
        code, left = _run_to_exit([GATEWAY, "serve", "--port", str(free_port())], output)
    assert code == 2 and left == [], output.read_text()
    _refused(output, "[ops] listen", "127.0.0.1:9464")


@contextmanager
def _serve_demo(argv: list[str], output: Path, tries: int = 3) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """The demo `argv + --port P --ops-port Q` (free ports) until it answers; again on other ports
    if one was taken in between (by one of its own stubs' free ports, say)."""
    for attempt in range(tries):
        port, ops_port = free_port(), free_port()
        with _session([*argv, "--port", str(port), "--ops-port", str(ops_port)], output) as proc:
            try:
                wait_http(f"http://127.0.0.1:{port}/healthz", proc, output, timeout=120)
            except RuntimeError as error:
                if "already in use" not in str(error) or attempt == tries - 1:
                    raise
                continue
            yield proc, port, ops_port
            return


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_demo_serves_on_the_ports_given_and_stops_with_its_stubs(tmp_path: Path, sig: int) -> None:
    output = tmp_path / "gateway.out"
    with _serve_demo([GATEWAY, "serve"], output) as (proc, port, ops_port):
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{ops_port}/status").status_code == 200
        text = output.read_text()
        assert f"curl -s localhost:{port}/v1/chat/completions" in text
        assert f"http://127.0.0.1:{ops_port}/status" in text
        assert len([line for line in _group(proc.pid) if " stub --listen " in line]) == 2
        proc.send_signal(sig)  # to the gateway alone: the first one drains
        assert proc.wait(timeout=30) == 0, output.read_text()
        assert _group(proc.pid) == [], output.read_text()


def test_sigterm_while_the_demo_starts_stops_its_stubs(tmp_path: Path) -> None:
    """As soon as both stubs are up (the gateway may still be starting, or serving already)."""
    output = tmp_path / "gateway.out"
    with _session([GATEWAY, "serve", "--port", str(free_port()), "--ops-port", "0"], output) as proc:
        deadline = time.monotonic() + 60
        while output.read_text().count("stub listening") < 2:
            assert time.monotonic() < deadline and proc.poll() is None, output.read_text()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, 128 + signal.SIGTERM), output.read_text()
        assert _group(proc.pid) == [], output.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_scripts_run_passes_its_arguments_to_serve_and_leaves_no_stub(tmp_path: Path, sig: int) -> None:
    """`scripts/run --port P --ops-port Q` (it runs scripts/setup, quick once .venv is there, then
    execs `gateway serve`: the signal reaches the gateway)."""
    output = tmp_path / "run.out"
    with _serve_demo([str(ROOT / "scripts" / "run")], output) as (proc, port, ops_port):
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{ops_port}/healthz").text == "ok\n"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, output.read_text()
        assert _group(proc.pid) == [], output.read_text()
