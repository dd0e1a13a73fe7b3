"""The embedded demo: `gateway serve` with no config runs against built-in stub upstreams.

Two stubs are started as child processes on loopback: `reasoning` (reasoning text,
each answer held 2 s, capped at 2 in flight with a queue of 4, so queueing is easy to
see) and `qwen2.5:3b-instruct` (uncapped, instant). They stop with the gateway, however
it stops. The gateway listens on 127.0.0.1:8080 and its ops listener on 127.0.0.1:9464
(`gateway serve --port N --ops-port N` moves them).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable

from config import Config, load_config_text

DEMO_TOML = """
[server]
listen = "127.0.0.1:8080"

[upstreams.reasoning]
url = "http://127.0.0.1:{reasoning_port}"
models = ["reasoning"]
[upstreams.reasoning.admission]
sequence_slots = 3
max_in_flight = 2
queue_depth = 4
queue_timeout_seconds = 30

[upstreams.qwen]
url = "http://127.0.0.1:{qwen_port}"
models = ["qwen2.5:3b-instruct"]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(proc: subprocess.Popen[bytes], port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"stub on port {port} did not start")


def demo_config() -> tuple[Config, Callable[[], None]]:
    """The demo's config and the function that stops its stubs, which are running by then (if
    this fails or is interrupted before it returns, it stops the ones it started itself)."""
    reasoning_port, qwen_port = _free_port(), _free_port()
    stub = [sys.executable, "-m", "cli", "stub"]
    procs: list[subprocess.Popen[bytes]] = []

    def stop() -> None:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    try:
        procs.append(subprocess.Popen([*stub, "--listen", f"127.0.0.1:{reasoning_port}", "--hold", "2",
                                       "--reasoning", "--log", "/tmp/stub-reasoning.log"]))
        procs.append(subprocess.Popen([*stub, "--listen", f"127.0.0.1:{qwen_port}"]))
        for proc, port in zip(procs, (reasoning_port, qwen_port), strict=True):
            _wait_listening(proc, port)
    except BaseException:
        stop()
        raise
    return load_config_text(DEMO_TOML.format(reasoning_port=reasoning_port, qwen_port=qwen_port)), stop


def banner(port: int, ops_port: int) -> str:
    """What to try, once the gateway's ports (`[server]` and `[ops]`) are bound."""
    return (
        "gateway demo: stub upstreams 'reasoning' (capped at 2, holds 2 s) and "
        "'qwen2.5:3b-instruct'. Try:\n"
        f"  curl -s localhost:{port}/v1/chat/completions -H 'content-type: application/json' "
        "-d '{\"model\":\"qwen2.5:3b-instruct\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n"
        f"  curl -N -s localhost:{port}/llm/v1/messages -H 'content-type: application/json' "
        "-d '{\"model\":\"reasoning\",\"max_tokens\":64,\"stream\":true,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n"
        f"Live status (slots, queue, 503s): http://127.0.0.1:{ops_port}/status (metrics: /metrics there)"
    )
