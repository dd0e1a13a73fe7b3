"""Reading the gateway's `/metrics` page in tests (prometheus_client's own parser)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> list[Sample]:
    """(metric, labels, value) of every sample of a Prometheus text page."""
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def gauge(page: list[Sample], name: str, upstream: str) -> float | None:
    """The value of `name{upstream=...}` on a parsed page, or None when absent."""
    for metric, labels, value in page:
        if metric == name and labels.get("upstream") == upstream:
            return value
    return None
