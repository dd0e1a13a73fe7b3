"""A queued `/llm` stream's `queue_wait_seconds` (access log and histogram) is its wait for the
slot, not that plus the upstream's time to first token.

The stub holds each answer 2 s before its first byte and logs when it starts each request;
the queued request's wait is that start minus the request's arrival (within 50 ms).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from tests.contract.admission.e2e_support import admission, body, http_client, logged, starts, until
from tests.support.metrics import samples
from tests.support.processes import Processes, upstream_toml


async def test_queued_llm_stream_wait_excludes_the_time_to_first_token(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "2", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 4)),
                       server_extra="queue_update_interval_seconds = 0.2")
    llm = body("llm", "reasoning", stream=True)
    async with http_client() as c:
        first = asyncio.create_task(c.post(gw.url + "/llm/v1/messages", json=llm, headers={"x-request-id": "first"}))
        await until(logged(log, 1), "the first request reached the stub")
        arrived = time.time()
        second = await c.post(gw.url + "/llm/v1/messages", json=llm, headers={"x-request-id": "queued"})
        assert (await first).status_code == 200 and second.status_code == 200
        assert second.text.startswith("event: queue")
        page = samples((await c.get(gw.ops_url + "/metrics")).text)
    expected = starts(log)[1].at - arrived  # ~2 s: the first request's whole answer
    assert expected > 1.5
    lines = [json.loads(line) for line in gw.text().splitlines() if line.startswith("{")]
    record = next(r for r in lines if r.get("request_id") == "queued")
    assert abs(record["queue_wait_seconds"] - expected) < 0.05, (record, expected)
    assert record["first_token_seconds"] > record["queue_wait_seconds"] + 1.5  # the hold came after the wait
    observed = {name: value for name, labels, value in page
                if name.startswith("gateway_queue_wait_seconds") and labels.get("upstream") == "reasoning"
                and "le" not in labels}
    assert observed["gateway_queue_wait_seconds_count"] == 2
    assert abs(observed["gateway_queue_wait_seconds_sum"] - expected) < 0.05, (observed, expected)
