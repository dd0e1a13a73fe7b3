"""One real gateway and stub per test module (the shared `procs` fixture is per test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.contract.fuzz.edge import Edge, running_edge


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("edge")) as running:
        yield running
