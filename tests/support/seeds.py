"""Running the seeds' Verify commands as written.

The seeds address the gateway as `localhost:8080`. Tests use that port when it is
free; if something else holds it, the commands are run with the port replaced, and
nothing else in them changes.
"""

from __future__ import annotations

import socket
import subprocess

from tests.support.processes import free_port

SEED_PORT = 8080


def seed_gateway_port() -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", SEED_PORT))
        except OSError:
            return free_port()
    return SEED_PORT


def seed_shell(script: str, port: int, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    if port != SEED_PORT:
        script = script.replace("localhost:8080", f"localhost:{port}")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout, check=False)
