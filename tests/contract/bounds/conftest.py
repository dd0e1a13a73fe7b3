"""One real gateway with the default limits in front of a stub that logs each chat request it
starts: a refusal at the edge must leave that log unchanged (nothing reached the upstream)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
from tests.support.processes import Proc, Processes, upstream_toml

MODEL = "reasoning"


@dataclass
class Edge:
    gateway: Proc
    log: Path

    def reached(self) -> int:
        """How many chat requests the upstream has started so far."""
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateway.url}/v1", api_key="x", max_retries=0, timeout=20)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=f"{self.gateway.url}/llm", api_key="x", max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    workdir = tmp_path_factory.mktemp("bounds")
    procs = Processes(workdir)
    log = workdir / "stub.log"
    try:
        stub = procs.stub("--tokens", "4", log=log)
        yield Edge(procs.gateway(upstream_toml(MODEL, stub.url, [MODEL], extra='aliases = ["claude-*"]\n')), log)
    finally:
        procs.stop_all()
