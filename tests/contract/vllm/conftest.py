"""The real vLLM (CPU build, tiny local model) as the gateway's upstream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.processes import upstream_toml
from tests.support.real_vllm import MAX_NUM_SEQS, MODEL, Fleet, VllmServer


@pytest.fixture(scope="package")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The vLLM servers, up while this folder's tests run (about 9 GB of memory together)."""
    fleet = Fleet(tmp_path_factory.mktemp("vllm"))
    yield fleet
    fleet.stop()


@pytest.fixture
def vllm(vllm_fleet: Fleet) -> VllmServer:
    """vLLM with the flags of a production deployment, no reasoning parser."""
    return vllm_fleet["main"]


def vllm_toml(server: VllmServer, *, cap: int = 3, queue: int = 32, extra: str = "") -> str:
    """The gateway's upstream table for a real vLLM: `tiny`, capped at `cap` of its 4 slots."""
    admission = {"sequence_slots": MAX_NUM_SEQS, "max_in_flight": cap, "queue_depth": queue,
                 "queue_timeout_seconds": 120}
    return upstream_toml("tiny", server.url, [MODEL], admission, extra=extra)
