"""Text completions and embeddings under the upstream's one admission: they meet chat (and every
surface) in the same cap and FIFO, are refused by the same full queue, leave the queue on a
hang-up, and their usage is charged to the consumer's limits like chat."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import openai
from tests.contract.admission.e2e_support import admission, hang_up, http_client, open_raw, scrape, until, until_metric
from tests.support.metrics import samples
from tests.support.processes import Processes, upstream_toml

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

_LINE = re.compile(r"^(\S+) (chat|completion|embeddings) start ")
_MODEL, _PEAK = re.compile(r' model="([^"]*)"'), re.compile(r" max_concurrent=(\d+)")
TEXT = {"model": "reasoning", "prompt": "x", "max_tokens": 2}
EMBED = {"model": "reasoning", "input": ["x"]}
CHAT = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}


def lines(log: Path) -> list[tuple[str, str, int]]:
    """(kind, model, max_concurrent) of every request the stub started, in order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        kind, model, peak = _LINE.match(line), _MODEL.search(line), _PEAK.search(line)
        if kind and model and peak:
            out.append((kind[2], model[1], int(peak[1])))
    return out


async def post(c: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return await c.post(url + path, json=body)


async def test_one_cap_and_one_fifo_with_chat(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    order = [("/v1/completions", {**TEXT, "model": "m-text"}), ("/v1/embeddings", {**EMBED, "model": "m-embed"}),
             ("/v1/chat/completions", {**CHAT, "model": "m-chat"}),
             ("/v1/completions", {**TEXT, "model": "m-stream", "stream": True})]
    stub = procs.stub("--hold", "0.5", "--tokens", "2", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning", "m-text", "m-embed", "m-chat", "m-stream"],
                                     admission(1, 8)))
    async with http_client() as c:
        tasks = [asyncio.create_task(post(c, gw.url, "/v1/completions", TEXT))]  # a completion holds the slot
        await until(lambda: len(lines(log)) == 1, "the completion reached the stub")
        for n, (path, body) in enumerate(order, start=1):
            tasks.append(asyncio.create_task(post(c, gw.url, path, body)))
            await until_metric(c, gw, "admission.queued", n)
        replies = await asyncio.gather(*tasks)
        metrics = await scrape(c, gw)
    assert [r.status_code for r in replies] == [200] * 5, [r.text for r in replies]
    assert replies[-1].text.endswith("data: [DONE]\n\n")
    started = lines(log)
    assert [(kind, model) for kind, model, _ in started] == [
        ("completion", "reasoning"), ("completion", "m-text"), ("embeddings", "m-embed"), ("chat", "m-chat"),
        ("completion", "m-stream")]  # one arrival order across the paths
    assert max(peak for *_, peak in started) == 1  # never two at once: one cap
    assert (metrics["slots_in_use"], metrics["queue_depth"]) == (0, 0)


async def test_the_same_full_queue_and_a_queued_hang_up(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "1.5", log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], admission(1, 1)))
    async with http_client() as c:
        holder = asyncio.create_task(post(c, gw.url, "/v1/chat/completions", CHAT))
        await until(lambda: len(lines(log)) == 1, "the chat request reached the stub")
        _, writer = await open_raw(gw, "v1", "reasoning", True, path="/v1/completions",
                                   payload={**TEXT, "stream": True})
        await until_metric(c, gw, "queue_depth", 1)
        refused = [await post(c, gw.url, path, body) for path, body in
                   (("/v1/completions", TEXT), ("/v1/embeddings", EMBED), ("/v1/chat/completions", CHAT))]
        await hang_up(writer)  # the queued completion leaves the queue
        await until_metric(c, gw, "queue_depth", 0, timeout=3)
        assert (await holder).status_code == 200
        await asyncio.sleep(0.3)
        metrics = await scrape(c, gw)
    assert [r.status_code for r in refused] == [503] * 3
    bodies = [{k: v for k, v in r.json().items() if k != "instance"} for r in refused]
    assert bodies[0] == bodies[1] == bodies[2] and bodies[0]["error"]["code"] == "queue-full"
    assert all(r.headers["content-type"] == "application/problem+json" and int(r.headers["retry-after"]) >= 1
               for r in refused)
    assert metrics["admission.abandoned"] == 1 and metrics["slots_in_use"] == 0
    assert len(lines(log)) == 1  # the hung-up completion never reached the stub


async def test_usage_is_charged_to_the_consumer(procs: Processes, tmp_path: Path) -> None:
    key = new_key()
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[consumers.coder]\nkeys = ["{key_digest(key)}"]\ntokens_per_minute = 100000\n')
    stub = procs.stub("--tokens", "4")
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"])
                       + f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n')
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=20)
    plain = await client.completions.create(model="reasoning", prompt="a b c")
    streamed = [chunk async for chunk in await client.completions.create(
        model="reasoning", prompt="d e", stream=True, stream_options={"include_usage": True})]
    vectors = await client.embeddings.create(model="reasoning", input=["f g", "h"])
    raw = await client.completions.with_raw_response.create(model="reasoning", prompt="i")
    async with httpx.AsyncClient(timeout=20) as c:
        charged = {labels["kind"]: v for name, labels, v in samples((await c.get(gw.ops_url + "/metrics")).text)
                   if name == "gateway_consumer_tokens_total" and labels["consumer"] == "coder"}
        anonymous = await c.post(gw.url + "/v1/embeddings", json=EMBED)
    assert plain.usage is not None and streamed[-1].usage is not None
    assert (plain.usage.prompt_tokens, streamed[-1].usage.prompt_tokens, vectors.usage.prompt_tokens) == (3, 2, 3)
    assert charged == {"input": 3 + 2 + 3 + 1, "output": 4 + 4 + 4, "cached": 0}
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 100000
    assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
