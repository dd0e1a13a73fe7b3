"""The bench scripts as modules: bench/ is not a package, so each test loads the script it reads,
with bench/ on the path only while it imports (its sibling modules)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


def load_bench(script: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{Path(script).stem}", BENCH / script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return load_bench("report.py")


@pytest.fixture(scope="module")
def callgrind() -> ModuleType:
    return load_bench("callgrind.py")


@pytest.fixture(scope="module")
def paced() -> ModuleType:
    return load_bench("paced.py")


@pytest.fixture(scope="module")
def instructions() -> ModuleType:
    return load_bench("instructions.py")


@pytest.fixture(scope="module")
def fairness() -> ModuleType:
    return load_bench("fairness.py")
