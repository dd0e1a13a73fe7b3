"""bench/cpu_cost.py `--opcodes`: whatif's per-code-object opcode counts, per request, by package
and by function (where ours' own bytecode goes, against the ceiling's)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
ROOT = BENCH.parent


@pytest.fixture(scope="module")
def cpu_cost():  # type: ignore[no-untyped-def]
    """bench/cpu_cost.py, with bench/ on the path only while it imports (its sibling modules)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_cpu_cost", BENCH / "cpu_cost.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_counts_are_split_per_request_by_package_and_function(cpu_cost, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    site = "/x/.venv/lib/python3.11/site-packages"
    counts = {
        f"{ROOT}/src/adapters/outbound/openai_compat/stream_mapping.py:277:feed_events": 2000,
        f"{ROOT}/src/domain/usage_estimate.py:103:feed_batch": 400,
        f"{site}/aiohttp/streams.py:463:readany": 1000,
        f"{site}/aiohttp/client_proto.py:316:data_received": 600,
        f"{site}/sniffio/_impl.py:25:current_async_library": 10,
        "/usr/lib/python3.11/asyncio/tasks.py:35:current_task": 300,
        f"{ROOT}/bench/ceiling.py:26:relay": 90,
        "<frozen abc>:117:__instancecheck__": 4,
    }
    path = tmp_path / "opcodes.json"
    path.write_text(json.dumps(counts))
    total, packages, functions = cpu_cost.opcode_split(path, 2, top=3)
    assert total == sum(counts.values()) // 2
    assert packages == {"src": 1200, "aiohttp": 800, "stdlib": 150, "bench": 45, "sniffio": 5,
                        "<frozen abc>": 2}
    assert list(packages) == ["src", "aiohttp", "stdlib", "bench", "sniffio", "<frozen abc>"]  # largest first
    assert functions == {
        "feed_events (src/adapters/outbound/openai_compat/stream_mapping.py:277)": 1000,
        "readany (aiohttp/streams.py:463)": 500,
        "data_received (aiohttp/client_proto.py:316)": 300,
    }
