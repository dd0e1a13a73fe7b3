"""Fair queueing end to end: a real gateway, the stub (cap 1, 200 ms answers), keys.

Consumer A sends 30 requests, then B sends 5, then C (priority 10) sends 1, across `/v1`
and `/llm` (streams among them, to watch their queue frames). Each request's user text
names it (`A-07`), and the stub's `--log` line shows it (`user="A-07"`), so the log is
the dispatch order. `fifo`: arrival order, whoever asks. `fair`: A and B alternate, C
goes next.
"""

from __future__ import annotations

import asyncio
import re
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.contract.admission.e2e_support import admission, parse_frames, scrape, until
from tests.support.metrics import gauge, samples
from tests.support.processes import Proc, Processes, upstream_toml

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

KEYS = {"A": new_key(), "B": new_key(), "C": new_key()}
_USER = re.compile(r' user="([A-C])-(\d+)"')


def _keys_file(path: Path) -> Path:
    path.write_text("".join(
        f'[consumers.{name}]\nkeys = ["{key_digest(key)}"]\n' + ("priority = 10\n" if name == "C" else "")
        for name, key in KEYS.items()))
    return path


def _gateway(procs: Processes, tmp_path: Path, fairness: str) -> tuple[Proc, Path]:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "0.2", "--tokens", "2", log=log)
    table = {**admission(1, 40, timeout=60), "fairness": f'"{fairness}"'}
    toml = upstream_toml("reasoning", stub.url, ["reasoning"], table)  # type: ignore[arg-type]
    toml += f'\n[auth]\nmode = "required"\nkeys_file = "{_keys_file(tmp_path / "keys.toml")}"\n'
    return procs.gateway(toml), log


def _dispatched(log: Path) -> list[str]:
    """Whose request the stub started, in order (`A-07`, ...)."""
    if not log.exists():
        return []
    return [f"{m.group(1)}-{int(m.group(2)):02d}" for m in map(_USER.search, log.read_text().splitlines()) if m]


async def _send(c: httpx.AsyncClient, gw: Proc, who: str, n: int, surface: str, stream: bool) -> bytes:
    text = f"{who}-{n:02d}"
    key = KEYS[who]
    payload: dict[str, Any] = {"model": "reasoning", "stream": stream,
                               "messages": [{"role": "user", "content": text}]}
    if surface == "v1":
        r = await c.post(gw.url + "/v1/chat/completions", json=payload, headers={"authorization": f"Bearer {key}"})
    else:
        r = await c.post(gw.url + "/llm/v1/messages", json={**payload, "max_tokens": 8}, headers={"x-api-key": key})
    assert r.status_code == 200, (text, r.status_code, r.text)
    return r.content


async def _entered(c: httpx.AsyncClient, gw: Proc) -> int:
    """Requests the gate has taken in so far: every grant (at once or from the queue), every
    one still waiting, and every one that left the queue otherwise."""
    s = await scrape(c, gw)
    parts = ("admission.admitted", "queue_depth", "admission.timed_out", "admission.abandoned")
    return int(sum(s.get(p, 0.0) for p in parts))


@pytest.mark.slow
@pytest.mark.parametrize("fairness", ["fifo", "fair"])
async def test_a_backlog_does_not_starve_others_under_fair(procs: Processes, tmp_path: Path, fairness: str) -> None:
    gw, log = _gateway(procs, tmp_path, fairness)
    plan = [("A", i) for i in range(30)] + [("B", i) for i in range(5)] + [("C", 0)]
    tasks: dict[str, asyncio.Task[bytes]] = {}
    streamed: list[str] = []
    seen_at: dict[str, int] = {}  # request -> dispatches logged when it was in the queue
    async with httpx.AsyncClient(timeout=httpx.Timeout(90.0), limits=httpx.Limits(max_connections=100)) as c:
        for k, (who, n) in enumerate(plan):
            surface = "llm" if k % 2 == 0 else "v1"  # both dialects, one queue
            name = f"{who}-{n:02d}"
            stream = surface == "llm" and k % 4 == 0
            streamed += [name] if stream else []
            tasks[name] = asyncio.create_task(_send(c, gw, who, n, surface, stream))

            async def arrived(k: int = k) -> bool:
                return await _entered(c, gw) == k + 1

            await until(arrived, f"{name} reached the gate", timeout=10)  # arrival order is the plan's
            seen_at[name] = len(_dispatched(log))
        page = samples((await c.get(gw.ops_url + "/metrics")).text)  # C in, A and B waiting
        bodies = dict(zip(tasks, await asyncio.gather(*tasks.values()), strict=True))
        waits = samples((await c.get(gw.ops_url + "/metrics")).text)
    total = gauge(page, "gateway_upstream_queue_depth", "reasoning")
    bands = {labels["priority"]: v for name, labels, v in page if name == "gateway_upstream_queue_depth_by_priority"}
    assert total is not None and total > 0 and sum(bands.values()) == total and bands["0"] > 0
    counted = {labels["consumer"]: v for name, labels, v in waits
               if name == "gateway_queue_wait_seconds_count" and labels["upstream"] == "reasoning"}
    assert counted == {"A": 30, "B": 5, "C": 1}  # the queue wait histogram, per consumer
    order = _dispatched(log)
    assert sorted(order) == sorted(tasks) and len(order) == 36
    for who in "AB":  # arrival order within each consumer, across /v1 and /llm
        mine = [r for r in order if r[0] == who]
        assert mine == sorted(mine)
    if fairness == "fifo":  # today's single queue: B waits for all of A, C (priority 10) for B
        assert order == [name for name, _ in zip(tasks, plan, strict=True)]
    else:
        b_start = seen_at["B-00"]
        assert order.index("B-04") < b_start + 12, order
        assert order.index("C-00") <= seen_at["C-00"] + 1, order  # next (one may be starting already)
        after = {r[0] for r in order[order.index("C-00") + 1:]}
        assert after == {"A", "B"}  # both A and B still had requests waiting when C went first
    for name in streamed:  # queue frames: >= 1, before message_start, none if admitted at once
        events = parse_frames(bodies[name])
        names = [e.name for e in events]
        positions = [e.data["position"] for e in events if e.name == "queue"]
        assert all(p >= 1 for p in positions), (name, positions)
        assert "message_start" in names and "queue" not in names[names.index("message_start"):]
        if name == "A-00":
            assert positions == []
        else:
            assert positions, name


@pytest.mark.slow
async def test_three_processes_on_one_redis_keep_the_fair_order(procs: Processes, tmp_path: Path) -> None:
    """The same scenario, fair, with A's, B's and C's requests spread over 3 gateway processes
    on one Redis: one schedule per upstream, whichever replica a request reached."""
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "0.2", "--tokens", "2", log=log)
    table = {**admission(1, 40, timeout=60), "fairness": '"fair"'}
    toml = upstream_toml("reasoning", stub.url, ["reasoning"], table)  # type: ignore[arg-type]
    toml += f'\n[auth]\nmode = "required"\nkeys_file = "{_keys_file(tmp_path / "keys.toml")}"\n'
    toml += (f'\n[admission]\nbackend = "redis"\nredis_url = "redis://127.0.0.1:6379/0"\n'
             f'key_prefix = "{tmp_path.name}"\n')
    gateways = procs.together(partial(procs.gateway, toml) for _ in range(3))
    plan = [("A", i) for i in range(30)] + [("B", i) for i in range(5)] + [("C", 0)]
    seen_at: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(90.0), limits=httpx.Limits(max_connections=100)) as c:

        async def entered() -> int:  # grants are counted per process; the queue is shared
            pages = [await scrape(c, gw) for gw in gateways]
            done = sum(p.get(k, 0.0) for p in pages for k in ("admission.admitted", "admission.timed_out",
                                                               "admission.abandoned"))
            return int(done + pages[0].get("queue_depth", 0.0))

        tasks = []
        for k, (who, n) in enumerate(plan):
            name = f"{who}-{n:02d}"
            tasks.append(asyncio.create_task(_send(c, gateways[k % 3], who, n, "llm" if k % 2 else "v1", False)))

            async def arrived(k: int = k) -> bool:
                return await entered() == k + 1

            await until(arrived, f"{name} reached the gate", timeout=10)
            seen_at[name] = len(_dispatched(log))
        await asyncio.gather(*tasks)
    order = _dispatched(log)
    assert len(order) == 36
    for who in "AB":
        mine = [r for r in order if r[0] == who]
        assert mine == sorted(mine)
    assert order.index("B-04") < seen_at["B-00"] + 12, order
    assert order.index("C-00") <= seen_at["C-00"] + 1, order
    assert {r[0] for r in order[order.index("C-00") + 1:]} == {"A", "B"}
