"""What the token-fairness end-to-end tests share: two consumers in a keys file, A asking
400-token answers and B 20-token ones from the stub paced like a GPU, their floods through
one gateway or several, and the weighted service (input + 2 x output) each got over a
measured window, read from the gateways' `/metrics` (`gateway_consumer_tokens_total`)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
from tests.contract.admission.e2e_support import until
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

KEYS = {"A": new_key(), "B": new_key()}
ANSWER = {"A": 400, "B": 20}  # max_tokens of each consumer's requests (the stub answers that many)
CHUNK_DELAY = "0.003"  # the stub's seconds a token: a 400-token answer streams for 1.2 s
WARM_UP, WINDOW = 2.0, 10.0  # seconds: measured from the end of the warm-up, for the window


def paced_stub(procs: Processes) -> Proc:
    return procs.stub("--tokens", "400", "--chunk-delay", CHUNK_DELAY)


def auth_toml(tmp_path: Path) -> str:
    """The `[auth]` table of a gateway that knows A and B (equal weights)."""
    keys = tmp_path / "keys.toml"
    keys.write_text("".join(f'[consumers.{who}]\nkeys = ["{key_digest(key)}"]\n' for who, key in KEYS.items()))
    return f'\n[auth]\nmode = "required"\nkeys_file = "{keys}"\n'


async def _flood(c: httpx.AsyncClient, gw: Proc, who: str) -> None:
    body = {"model": "m", "stream": True, "max_tokens": ANSWER[who], "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"{who} wants a story"}]}
    headers = {"authorization": f"Bearer {KEYS[who]}"}
    for _ in range(10_000):  # bounded; cancelled at the end of the window anyway
        async with c.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            async for _chunk in r.aiter_bytes():
                pass


async def _weighted(c: httpx.AsyncClient, gateways: list[Proc]) -> dict[str, float]:
    """Each consumer's input + 2 x output tokens on the upstream so far, over every gateway."""
    out = dict.fromkeys(KEYS, 0.0)
    for gw in gateways:
        for name, labels, value in samples((await c.get(gw.ops_url + "/metrics")).text):
            if name == "gateway_consumer_tokens_total" and labels["upstream"] == "m":
                out[labels["consumer"]] += {"input": 1.0, "output": 2.0}.get(labels["kind"], 0.0) * value
    return out


async def service_in_window(gateways: list[Proc], workers: int) -> tuple[float, float]:
    """A's and B's weighted service over the window, each flooding through every gateway with
    `workers` requests in flight there."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=httpx.Limits(max_connections=40)) as c:
        tasks = [asyncio.create_task(_flood(c, gw, who)) for gw in gateways for who in KEYS for _ in range(workers)]
        try:
            async def both_served() -> bool:
                return all(v > 0 for v in (await _weighted(c, gateways)).values())

            await until(both_served, "both consumers served", timeout=10)
            await asyncio.sleep(WARM_UP)
            before = await _weighted(c, gateways)
            await asyncio.sleep(WINDOW)
            after = await _weighted(c, gateways)
            assert not [t for t in tasks if t.done()], [t.exception() for t in tasks if t.done()]
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
    a, b = (after[who] - before[who] for who in ("A", "B"))
    return a, b
