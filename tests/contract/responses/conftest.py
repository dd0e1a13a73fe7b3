"""The capturing upstream, shared by the modules of this folder (one per module)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from tests.support.capture_upstream import CaptureServer


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureServer]:
    server = CaptureServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


