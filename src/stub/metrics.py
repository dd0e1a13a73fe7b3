"""`GET /metrics` with `--max-num-seqs`: vLLM 0.32's scheduler gauges, in Prometheus text.

What vLLM 0.32 exports for them, with its help texts and its labels (`engine`, the engine
core's index, "0" without data parallelism, and `model_name`, the served model name; sorted,
as vLLM's multiprocess registry writes them):

- `vllm:num_requests_running`: requests in the running batch;
- `vllm:num_requests_waiting`: received, not yet scheduled (every reason);
- `vllm:num_requests_waiting_by_reason{reason=...}`: the same split, `capacity` (waiting for
  a slot or KV blocks) and `deferred` (waiting for something else: a grammar being compiled,
  a LoRA adapter, a KV transfer). The stub's waiters all wait for a slot: `deferred` is 0;
- `vllm:kv_cache_usage_perc`: the fraction of KV blocks in use; the stub has no KV blocks and
  reports the fraction of its `--max-num-seqs` places generating.

Read from the scheduler at scrape time (a custom collector, as prometheus_client documents
them), so a request costs nothing extra. vLLM's other families (token counters, latency
histograms, HTTP metrics) are not served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stub.scheduler import Scheduler

ENGINE = "0"
WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
    "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
    "Sum of all reasons equals vllm:num_requests_waiting."
)


class _SchedulerCollector(Collector):
    def __init__(self, scheduler: Scheduler, model: str) -> None:
        self.scheduler, self.model = scheduler, model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        scheduler, labels, values = self.scheduler, ["engine", "model_name"], [ENGINE, self.model]
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=labels)
        running.add_metric(values, scheduler.running)
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=labels)
        waiting.add_metric(values, scheduler.waiting)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason", WAITING_BY_REASON_HELP, labels=[*labels, "reason"])
        by_reason.add_metric([*values, "capacity"], scheduler.waiting)
        by_reason.add_metric([*values, "deferred"], 0)
        usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels=labels)
        usage.add_metric(values, scheduler.used / scheduler.slots)
        yield running
        yield waiting
        yield by_reason
        yield usage


def scheduler_metrics(scheduler: Scheduler, model: str) -> Callable[[], bytes]:
    """The body of `GET /metrics`, rendered on each call."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SchedulerCollector(scheduler, model))
    return lambda: generate_latest(registry)
