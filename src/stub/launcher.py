"""Run the stub as a real subprocess, for test suites and benchmarks (gateway tests too).

``with running_stub("--hold", "2", "--log", path) as base: ...`` starts
``python -m stub --listen 127.0.0.1:<free port> ...`` with this package importable,
waits until ``GET /health`` answers, yields ``http://127.0.0.1:<port>`` and stops the
process (SIGTERM) on exit.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the stub binds it right after)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_stub(*args: str, timeout: float = 15.0) -> Iterator[str]:
    """Start the stub with ``args`` (after ``--listen``); yield its base URL once healthy."""
    port = free_port()
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "stub", "--listen", f"127.0.0.1:{port}", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": path})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the stub exited with status {proc.returncode}")
            with contextlib.suppress(OSError), urllib.request.urlopen(base + "/health", timeout=1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stub did not answer /health within {timeout} s")
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
