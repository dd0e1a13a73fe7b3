"""`GET /metrics` with `--max-num-seqs`: vLLM's scheduler gauges, in Prometheus text.

vLLM exports `vllm:num_requests_running` (in the running batch) and
`vllm:num_requests_waiting` (received, not yet scheduled), labelled `model_name` with
its served model name. Read from the scheduler at scrape time (a custom collector, as
prometheus_client documents them), so a request costs nothing extra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stub.scheduler import Scheduler


class _SchedulerCollector(Collector):
    def __init__(self, scheduler: Scheduler, model: str) -> None:
        self.scheduler, self.model = scheduler, model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=["model_name"]
        )
        running.add_metric([self.model], self.scheduler.running)
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=["model_name"]
        )
        waiting.add_metric([self.model], self.scheduler.waiting)
        yield running
        yield waiting


def scheduler_metrics(scheduler: Scheduler, model: str) -> Callable[[], bytes]:
    """The body of `GET /metrics`, rendered on each call."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SchedulerCollector(scheduler, model))
    return lambda: generate_latest(registry)
