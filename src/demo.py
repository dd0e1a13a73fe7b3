"""The embedded demo: `gateway serve` with no config runs against built-in stub upstreams.

Two stubs are started as child processes on loopback: `reasoning` (reasoning text,
each answer held 2 s, capped at 2 in flight with a queue of 4, so queueing is easy to
see) and `qwen2.5:3b-instruct` (uncapped, instant). They stop with the gateway.
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


def _wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"stub on port {port} did not start")


def demo_config() -> tuple[Config, Callable[[], None]]:
    reasoning_port, qwen_port = _free_port(), _free_port()
    stub = [sys.executable, "-m", "cli", "stub"]
    procs = [
        subprocess.Popen([*stub, "--listen", f"127.0.0.1:{reasoning_port}", "--hold", "2", "--reasoning",
                          "--log", "/tmp/stub-reasoning.log"]),
        subprocess.Popen([*stub, "--listen", f"127.0.0.1:{qwen_port}"]),
    ]

    def stop() -> None:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=5)

    try:
        _wait_listening(reasoning_port)
        _wait_listening(qwen_port)
    except RuntimeError:
        stop()
        raise
    print(
        "gateway demo: stub upstreams 'reasoning' (capped at 2, holds 2 s) and "
        "'qwen2.5:3b-instruct'. Try:\n"
        "  curl -s localhost:8080/v1/chat/completions -H 'content-type: application/json' "
        "-d '{\"model\":\"qwen2.5:3b-instruct\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n"
        "  curl -N -s localhost:8080/llm/v1/messages -H 'content-type: application/json' "
        "-d '{\"model\":\"reasoning\",\"max_tokens\":64,\"stream\":true,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n"
        "Live status (slots, queue, 503s): http://127.0.0.1:9464/status (metrics: /metrics there)",
        file=sys.stderr, flush=True,
    )
    return load_config_text(DEMO_TOML.format(reasoning_port=reasoning_port, qwen_port=qwen_port)), stop
