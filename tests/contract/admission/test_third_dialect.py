"""A third inbound dialect, added without touching domain, ports, application or outbound.

`third_dialect.py` (surface `plain`, `POST /plain/v1/generate`) is registered through
`bootstrap.DIALECTS` by `serve_with_third_dialect.py`, a real uvicorn process. Its
requests meet `/v1` and `/llm` at the one gate of the upstream: one cap, one FIFO
queue, one full-queue decision rendered in each surface's own shape.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
from tests.contract.admission.e2e_support import (
    Reply,
    admission,
    call,
    hang_up,
    http_client,
    logged,
    open_raw,
    scrape,
    starts,
    until,
    until_metric,
)
from tests.support.processes import Proc, Processes, upstream_toml

LAUNCHER = [sys.executable, str(Path(__file__).resolve().parent / "serve_with_third_dialect.py")]
PLAIN = "/plain/v1/generate"


def _gateway(procs: Processes, log: Path, hold: str, limits: dict[str, float], models: list[str]) -> Proc:
    stub = procs.stub("--hold", hold, "--tokens", "4", log=log)
    return procs.gateway(upstream_toml("reasoning", stub.url, models, limits), launcher=LAUNCHER)


async def plain(c: httpx.AsyncClient, gw: Proc, model: str, **extra: Any) -> Reply:
    response = await c.post(gw.url + PLAIN, json={"model": model, "prompt": "hi", **extra})
    return Reply(response.status_code, response.headers, response.content, response.elapsed.total_seconds())


async def test_third_dialect_shares_the_one_fifo_and_the_full_queue(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    order = ["m-v1", "m-plain", "m-llm"]
    gw = _gateway(procs, log, "0.8", admission(1, 3), ["reasoning", *order])
    async with http_client() as c:
        tasks = [asyncio.create_task(plain(c, gw, "reasoning"))]  # the third dialect holds the slot
        await until(logged(log, 1), "the plain request reached the stub")
        for n, model in enumerate(order, start=1):
            surface = model.removeprefix("m-")
            request = plain(c, gw, model) if surface == "plain" else call(c, gw, surface, model)
            tasks.append(asyncio.create_task(request))
            await until_metric(c, gw, "admission.queued", n)
        # the queue holds 3, whichever surfaces they came from: every surface is turned away
        refused = await asyncio.gather(plain(c, gw, "reasoning"), call(c, gw, "v1", "m-v1"),
                                       call(c, gw, "llm", "m-llm"))
        replies = await asyncio.gather(*tasks)
        metrics = await scrape(c, gw)
    assert [r.status for r in replies] == [200] * 4, [r.text for r in replies]
    assert replies[0].json()["text"] and replies[2].json()["text"]
    assert [line.model for line in starts(log)] == ["reasoning", *order]  # one FIFO for all three
    assert [line.in_flight for line in starts(log)] == [1] * 4
    assert [r.status for r in refused] == [503] * 3
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert refused[0].json() == {"error": "queue-full", "message": refused[0].json()["message"]}
    assert refused[1].headers["content-type"].startswith("application/problem+json")
    assert refused[2].json()["error"]["type"] == "overloaded_error"
    assert metrics["admission.rejected_full"] == 3
    assert '"surface":"plain"' in gw.text()  # the surface is a label in the access log


async def test_three_surfaces_at_once_never_exceed_the_cap(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log, "0.3", admission(2, 20), ["reasoning"])
    async with http_client() as c:
        burst = [plain(c, gw, "reasoning") for _ in range(4)]
        burst += [call(c, gw, surface, "reasoning", stream) for surface in ("v1", "llm")
                  for stream in (False, True) for _ in range(2)]
        replies = await asyncio.gather(*burst)
        metrics = await scrape(c, gw)
    assert [r.status for r in replies] == [200] * 12, [r.text for r in replies]
    lines = starts(log)
    assert len(lines) == 12
    assert max(line.max_concurrent for line in lines) == 2  # never 3: one cap for the three surfaces
    assert (metrics["slots_in_use"], metrics["queue_depth"]) == (0, 0)


async def test_third_dialect_errors_and_queued_hang_up(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    gw = _gateway(procs, log, "1", admission(1, 3), ["reasoning"])
    async with http_client() as c:
        unknown = await plain(c, gw, "nope")
        invalid = await c.post(gw.url + PLAIN, json={"model": "reasoning"})  # no prompt
        holder = asyncio.create_task(call(c, gw, "llm", "reasoning"))
        await until(logged(log, 1), "the /llm request reached the stub")
        _, writer = await open_raw(gw, "plain", "reasoning", False, path=PLAIN,
                                   payload={"model": "reasoning", "prompt": "hi"})
        await until_metric(c, gw, "queue_depth", 1)
        await hang_up(writer)
        await until_metric(c, gw, "queue_depth", 0, timeout=3)
        metrics = await scrape(c, gw)
        assert (await holder).status == 200
        await asyncio.sleep(0.3)
    assert unknown.status == 404 and unknown.json()["error"] == "model-not-found"
    assert invalid.status_code == 400 and invalid.json()["error"] == "invalid-request"
    assert metrics["admission.abandoned"] == 1 and metrics["slots_in_use"] == 1
    assert len(starts(log)) == 1  # the hung-up plain request never reached the stub


async def test_the_responses_dialect_meets_v1_and_llm_in_the_one_fifo(procs: Processes, tmp_path: Path) -> None:
    """The real third dialect (`/v1/responses`, registered in `bootstrap.DIALECTS` by `gateway serve`)."""
    log = tmp_path / "stub.log"
    order = ["m-v1", "m-responses", "m-llm", "m-responses-stream"]
    stub = procs.stub("--hold", "0.8", "--tokens", "4", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning", *order], admission(1, 4)))

    async def responses(c: httpx.AsyncClient, model: str, stream: bool = False) -> Reply:
        reply = await c.post(gw.url + "/v1/responses", json={"model": model, "input": "hi", "stream": stream})
        return Reply(reply.status_code, reply.headers, reply.content, reply.elapsed.total_seconds())

    async with http_client() as c:
        tasks = [asyncio.create_task(responses(c, "reasoning"))]  # the Responses API holds the slot
        await until(logged(log, 1), "the /v1/responses request reached the stub")
        for n, model in enumerate(order, start=1):
            if model.startswith("m-responses"):
                request = responses(c, model, stream=model.endswith("stream"))
            else:
                request = call(c, gw, model.removeprefix("m-"), model)
            tasks.append(asyncio.create_task(request))
            await until_metric(c, gw, "admission.queued", n)
        refused = await responses(c, "reasoning")  # the queue holds 4, whatever the surfaces
        replies = await asyncio.gather(*tasks)
        metrics = await scrape(c, gw)
    assert [r.status for r in replies] == [200] * 5, [r.text for r in replies]
    assert replies[0].json()["output"][0]["content"][0]["text"] == "alpha bravo charlie delta"
    assert b"event: response.queued" in replies[4].body  # it waited, and said so in its own vocabulary
    assert [line.model for line in starts(log)] == ["reasoning", *order]  # one FIFO for every surface
    assert max(line.max_concurrent for line in starts(log)) == 1
    assert refused.status == 503 and refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["error"]["code"] == "queue-full" and int(refused.headers["retry-after"]) >= 1
    assert metrics["admission.rejected_full"] == 1
    assert '"surface":"responses"' in gw.text()  # the surface is a label in the access log
