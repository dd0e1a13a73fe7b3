"""vLLM 0.32's `GET /metrics` page (`tests/fixtures/vllm-0.32-metrics.txt`, about 55 KB) with the
scheduler gauges a test wants, per engine."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.32-metrics.txt"
MODEL = "tiny-chat"


class Engine(NamedTuple):
    """One engine core's scheduler gauges (vLLM's `engine` label: its index)."""

    running: int = 0
    capacity: int = 0  # waiting for a slot or KV blocks
    deferred: int = 0  # waiting for something else


def fixture() -> str:
    return FIXTURE.read_text()


def vllm_page(*engines: Engine, old_vllm: bool = False) -> str:
    """The fixture with its running / waiting / waiting-by-reason samples replaced by one per
    engine ("0", "1", ...); `old_vllm`: without the by-reason family, as before vLLM split it."""
    lines: list[str] = []
    for line in fixture().splitlines():
        if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{",
                            "vllm:num_requests_waiting_by_reason{")):  # fmt: skip
            continue
        if old_vllm and "vllm:num_requests_waiting_by_reason" in line:
            continue
        lines.append(line)
        if line.startswith("# TYPE vllm:num_requests_running "):
            lines += [f'vllm:num_requests_running{{engine="{i}",model_name="{MODEL}"}} {e.running}.0'
                      for i, e in enumerate(engines)]  # fmt: skip
        elif line.startswith("# TYPE vllm:num_requests_waiting "):
            lines += [f'vllm:num_requests_waiting{{engine="{i}",model_name="{MODEL}"}} {e.capacity + e.deferred}.0'
                      for i, e in enumerate(engines)]  # fmt: skip
        elif line.startswith("# TYPE vllm:num_requests_waiting_by_reason "):
            lines += [f'vllm:num_requests_waiting_by_reason{{engine="{i}",model_name="{MODEL}",reason="{reason}"}}'
                      f" {count}.0" for i, e in enumerate(engines)
                      for reason, count in (("capacity", e.capacity), ("deferred", e.deferred))]  # fmt: skip
    return "\n".join(lines) + "\n"
