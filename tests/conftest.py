"""Shared fixtures: real stub and gateway processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import Processes


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Processes]:
    """Start processes with `procs.stub(...)` / `procs.gateway(toml)`; all are stopped after the test
    (told to stop; the next test does not wait for their exit).

    When a test fails, the processes' output is printed, once they have exited, to help find out why.
    """
    processes = Processes(tmp_path)
    yield processes
    report = getattr(request.node, "rep_call", None)
    failed = report is not None and report.failed
    processes.stop_all(wait=failed)  # the next test need not wait for these to exit
    if failed:
        for proc in processes.procs:
            print(f"--- {proc.output.name} ---\n{proc.text()[-4000:]}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
