"""Every metric the Grafana dashboard and the alert rules (deploy/monitoring) name is exported by
a running gateway's ops listener, except those listed as PENDING in tests/support/monitoring.py.

The gateway runs as in production: the Redis backend (so the Redis metrics exist), API keys on
(the consumer series), a capped upstream; some traffic makes every labelled family appear.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.support.monitoring import PENDING, dashboard_exprs, metric_names, rule_exprs
from tests.support.processes import Processes, upstream_toml

KEY = "gw_0be5c4ed_" + "m" * 43
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "gauge": ("",), "summary": ("_sum", "_count", "_created")}


def _exported(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_of_the_dashboard_and_the_rules_is_exported(procs: Processes, tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[consumers.frontend]\nkeys = ["sha256:{hashlib.sha256(KEY.encode()).hexdigest()}"]\n'
                    "requests_per_minute = 2\n")
    stub = procs.stub()
    gw = procs.gateway(
        f'[admission]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:6379/0"\n'
        f'key_prefix = "monitoring-{uuid.uuid4().hex[:8]}"\n'
        f'[auth]\nmode = "required"\nkeys_file = "{keys}"\n'
        + upstream_toml("reasoning", stub.url, ["reasoning"], {
            "sequence_slots": 3, "max_in_flight": 2, "queue_depth": 4, "queue_timeout_seconds": 30})
        # its replicas (the one stub): the replica series exist too
        + f'\n[upstreams.reasoning.endpoints]\nurls = ["{stub.url}"]\nsequence_slots = 2\nmax_in_flight = 2\n')
    headers = {"x-api-key": KEY}
    body = {"model": "reasoning", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    statuses = [httpx.post(f"{gw.url}/llm/v1/messages", json=body, headers=headers, timeout=20).status_code
                for _ in range(3)]
    assert statuses == [200, 200, 429]  # a stream (time to first token, tokens), then over the limit
    exported = _exported(httpx.get(gw.ops_url + "/metrics").text)
    used = metric_names(dashboard_exprs()) | metric_names(rule_exprs())
    missing = sorted(used - exported - PENDING)
    assert missing == [], missing
    assert PENDING <= used  # the pending ones are really used (and not exported yet: move them once they are)
    assert not PENDING & exported, "a pending metric is exported now: remove it from PENDING"
