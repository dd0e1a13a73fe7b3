"""The status page's server-side render: figures and bars the page's script refreshes by key."""

from __future__ import annotations

import re

from adapters.inbound.operations.status_page import render
from ports.status import ConsumerShareStatus, ConsumerStatus, ReplicaStatus, StatusReport, UpstreamStatus


def _report(**overrides: object) -> StatusReport:
    upstream = UpstreamStatus(
        name="reasoning", capped=True, cap=4, in_flight=3, queue_depth=2, queue_limit=8, queue_timeout_seconds=30.0,
        oldest_wait_seconds=1.25, queued_by_priority={"0": 2}, unavailable_last_minute=5,
        unavailable_by_reason={"queue-full": 5},
        replicas=[ReplicaStatus(address="10.0.0.1:8000", state="ready", in_flight=2, limit=4)])
    consumer = ConsumerStatus(name="<b>evil</b>", requests_last_minute=30, tokens_last_minute=900,
                              limited_last_minute=1, limited_by_limit={"requests_per_minute": 1},
                              requests_per_minute=60, tokens_per_minute=None)
    fields: dict[str, object] = {"time": 0.0, "window_seconds": 60.0, "ready": True, "backend": "memory",
                                 "workers": 1, "auth": True, "upstreams": [upstream], "consumers": [consumer]}
    fields.update(overrides)
    return StatusReport(**fields)  # type: ignore[arg-type]


def test_figures_and_bars_carry_their_keys_and_initial_values() -> None:
    page = render(_report())
    assert '<span class="num" data-v="u:reasoning:in_flight">3</span>' in page
    assert '<span class="num" data-v="u:reasoning:oldest_wait_seconds">1.2</span>' in page  # one decimal, as the JS
    assert 'data-bar="u:reasoning:in_flight" data-of="u:reasoning:cap" style="width:75.0%"' in page
    assert 'data-bar="u:reasoning:queue_depth" data-of="u:reasoning:queue_limit" style="width:25.0%"' in page
    assert 'data-v="r:reasoning:10.0.0.1:8000:state">ready<' in page
    assert 'data-bar="c:&lt;b&gt;evil&lt;/b&gt;:requests_last_minute" data-of="c:&lt;b&gt;evil&lt;/b&gt;:' \
           'requests_per_minute" style="width:50.0%"' in page
    assert 'data-rows="reasoning,10.0.0.1:8000 c:&lt;b&gt;evil&lt;/b&gt;"' in page


def test_names_are_escaped_and_nothing_is_loaded_from_elsewhere() -> None:
    page = render(_report())
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # no CDN, no external script or style
    assert 'fetch("status.json"' in page and "setInterval(refresh, 1000)" in page


def test_keys_off_and_an_uncapped_upstream() -> None:
    plain = UpstreamStatus(
        name="qwen", capped=False, cap=None, in_flight=7, queue_depth=0, queue_limit=None, queue_timeout_seconds=None,
        oldest_wait_seconds=None, queued_by_priority={}, unavailable_last_minute=0, unavailable_by_reason={},
        replicas=[])
    page = render(_report(auth=False, consumers=[], upstreams=[plain], ready=False))
    assert "in flight (uncapped)" in page and 'data-of="max:u:in_flight" style="width:100.0%"' in page
    assert "API keys are off" in page and ">draining<" in page


def test_each_upstream_shows_its_consumers_shares_and_fairness_index() -> None:
    share = ConsumerShareStatus(name="<b>evil</b>", input_tokens=300, output_tokens=150, cached_tokens=180,
                                weighted_tokens=600.0, token_share=0.75, slot_seconds=6.0, slot_share=0.625,
                                service=200.0)
    upstream = UpstreamStatus(
        name="qwen", capped=False, cap=None, in_flight=0, queue_depth=0, queue_limit=None, queue_timeout_seconds=None,
        oldest_wait_seconds=None, queued_by_priority={}, unavailable_last_minute=0, unavailable_by_reason={},
        replicas=[], fairness_index=0.8, consumers=[share])
    page = render(_report(upstreams=[upstream]))
    assert '<span class="num" data-v="u:qwen:fairness_index" data-fmt="2">0.80</span>' in page
    assert 'data-bar="u:qwen:fairness_index" data-of="1" style="width:80.0%"' in page
    assert 'data-v="s:qwen:&lt;b&gt;evil&lt;/b&gt;:slot_share" data-fmt="pct">63%<' in page  # as JS Math.round
    assert 'data-bar="s:qwen:&lt;b&gt;evil&lt;/b&gt;:token_share" data-of="1" style="width:75.0%"' in page
    assert 'data-rows="qwen,s:&lt;b&gt;evil&lt;/b&gt; c:&lt;b&gt;evil&lt;/b&gt;"' in page  # a new consumer: reload
    assert "<b>evil</b>" not in page
    keys_off = render(_report(auth=False, consumers=[], upstreams=[upstream]))
    assert "fairness_index" not in keys_off  # one anonymous consumer: nothing to share
