"""The `gateway` command as an operator meets it: real processes of the installed entry point.

`--help` says what the gateway is and lists the commands, `--version` the installed version;
`serve --port/--ops-port` override the ports of a config file's `[server] listen` and
`[ops] listen`; a taken port (either one, one process or several workers) stops `serve`
with exit 2 and one line naming the key and the address, before anything starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from tests.contract.cli.held_port import held_port
from tests.support.processes import OPS_LINE, ROOT, Processes, free_port, upstream_toml, wait_http

GATEWAY = str(Path(sys.executable).with_name("gateway"))  # the console script of this environment
COMMANDS = {"serve", "check-config", "keys", "stub"}
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
CHAT = {"model": "plain", "messages": [{"role": "user", "content": "hi"}]}
WORKERS = ('[server]\nworkers = 2\n[admission]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:6379/0"\n'
           'key_prefix = "cli-test-{}"\n')


def _gateway(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=ROOT, env=ENV)



def test_help_says_what_the_gateway_is_and_lists_every_command_with_a_line() -> None:
    done = _gateway("--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps at the terminal's width
    assert "LLM API gateway" in text and "OpenAI API (/v1)" in text and "Anthropic Messages API (/llm)" in text
    assert "vLLM" in text and "admission control" in text
    assert "Composition root" not in text  # no longer the composition root's docstring
    listed = done.stdout.split("commands:")[1]
    for command in COMMANDS:
        line = next(line for line in listed.splitlines() if line.split()[:1] == [command])
        helped = line.split(command, 1)[1].strip() or listed.split(line + "\n")[1].splitlines()[0].strip()
        assert helped, f"{command} has no help line"
    assert "--version" in done.stdout


def test_each_command_has_its_own_help() -> None:
    for command in (["serve"], ["check-config"], ["keys"], ["keys", "new"], ["stub"]):
        done = _gateway(*command, "--help")
        assert done.returncode == 0 and done.stdout.startswith(f"usage: gateway {' '.join(command)}"), done.stderr
    serve = " ".join(_gateway("serve", "--help").stdout.split())
    assert "--port N" in serve and "--ops-port N" in serve and "1..65535" in serve and "0..65535" in serve


def test_version_is_the_installed_one() -> None:
    done = _gateway("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"gateway {version('gateway')}\n"


@pytest.mark.parametrize(("option", "value"), [("--port", "0"), ("--port", "65536"), ("--port", "x"),
                                                ("--ops-port", "-1"), ("--ops-port", "70000")])
def test_a_port_out_of_range_is_refused_before_anything_starts(option: str, value: str) -> None:
    done = _gateway("serve", option, value, timeout=30)
    assert done.returncode == 2 and f"argument {option}: must be a port" in done.stderr, done.stderr
    assert "stub listening" not in done.stderr  # not even the demo's stubs started


@contextmanager
def _serving(args: list[str], port: int, output: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`gateway serve ARGS` until it answers on `port`; SIGTERM at the end, which drains it (exit 0)."""
    with output.open("wb") as handle:
        gateway = subprocess.Popen([GATEWAY, "serve", *args], stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=ENV)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", gateway, output)
        yield gateway
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=30) == 0, output.read_text()


def test_the_options_override_the_ports_of_a_config_file(procs: Processes, tmp_path: Path) -> None:
    """The config names ports held by the test: the gateway serves on the ones given instead,
    on the config's hosts."""
    plain = procs.stub()
    with held_port() as main, held_port() as ops:
        config = tmp_path / "gateway.toml"
        config.write_text(f'[server]\nlisten = "127.0.0.1:{main}"\n[ops]\nlisten = "127.0.0.1:{ops}"\n'
                          + upstream_toml("plain", plain.url, ["plain"]))
        port, ops_port = free_port(), free_port()
        output = tmp_path / "gateway.out"
        with _serving(["--config", str(config), "--port", str(port), "--ops-port", str(ops_port)], port, output):
            assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT).status_code == 200
            assert httpx.get(f"http://127.0.0.1:{ops_port}/metrics").status_code == 200
            assert f"gateway ops listening on http://127.0.0.1:{ops_port}" in output.read_text()
        # `--ops-port 0`: any free port, printed at start
        port = free_port()
        with _serving(["--config", str(config), "--port", str(port), "--ops-port", "0"], port, output):
            printed = OPS_LINE.search(output.read_text())
            assert printed is not None and int(printed.group(1)) not in (0, ops)
            assert httpx.get(f"http://127.0.0.1:{printed.group(1)}/healthz").text == "ok\n"


def test_the_same_port_for_both_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(upstream_toml("plain", "http://127.0.0.1:9", ["plain"]))
    port = free_port()
    same = _gateway("serve", "--config", str(config), "--port", str(port), "--ops-port", str(port), timeout=30)
    assert same.returncode == 2, same.stderr
    assert same.stderr == (f"gateway: configuration error: ops.listen must differ from server.listen "
                           f"('127.0.0.1:{port}' is both)\n")


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("which", ["server", "ops"])
def test_a_taken_port_stops_serve_with_one_line_naming_it(tmp_path: Path, which: str, workers: int) -> None:
    """Before anything starts (no worker forked, no Redis connection): exit 2, one line."""
    shared = WORKERS.format(uuid.uuid4().hex[:8]) if workers > 1 else "[server]\n"
    config = tmp_path / "gateway.toml"
    with held_port() as taken:
        free = free_port()
        main, ops = (taken, free) if which == "server" else (free, taken)
        config.write_text(shared.replace("[server]\n", f'[server]\nlisten = "127.0.0.1:{main}"\n')
                          + f'[ops]\nlisten = "127.0.0.1:{ops}"\n' + upstream_toml("plain", "http://127.0.0.1:9",
                                                                                   ["plain"]))
        done = _gateway("serve", "--config", str(config), timeout=30)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "gateway ops listening" not in line]
    assert lines == [f"gateway: configuration error: [{which}] listen = '127.0.0.1:{taken}': "
                     "cannot listen there (Address already in use)"], done.stderr
