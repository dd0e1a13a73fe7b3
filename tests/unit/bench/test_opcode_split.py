"""bench/cpu_cost.py `--opcodes`: whatif's per-code-object opcode counts, per request, by package
and by function (where ours' own bytecode goes, against the ceiling's)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


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
