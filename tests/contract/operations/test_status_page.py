"""`/status` in a real browser: Debian's chromium driven by Playwright for Python.

The first test fills a capped upstream (cap 2) and its queue (4 places) with requests that the
stub holds 5 s each, arriving one by one, while the page is open at phone width; it reads
the figures from the DOM as the page refreshes itself from `/status.json`: in flight
reaches the cap, the queue depth rises to 4, then falls back to 0. The second has two
consumers share an upstream and reads their shares and the fairness index. No console
error; screenshots are saved (the test's tmp_path and `test-artifacts/`, gitignored).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
from playwright.async_api import Page, async_playwright
from tests.support.processes import ROOT, Processes, upstream_toml

from adapters.outbound.keys_file import new_key
from domain.consumers import key_digest

CHROMIUM = "/usr/bin/chromium"  # scripts/ensure-chromium; Playwright's own browser download is not reachable
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
CHAT = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}


async def _figures(page: Page) -> tuple[str, str, str]:
    values = []
    for key in ("in_flight", "queue_depth", "cap"):
        values.append((await page.text_content(f'[data-v="u:reasoning:{key}"]') or "").strip())
    return values[0], values[1], values[2]


def _runs(seen: list[int]) -> list[int]:
    """`seen` without consecutive repeats."""
    return [v for i, v in enumerate(seen) if i == 0 or seen[i - 1] != v]


async def test_status_page_follows_the_queue_filling_and_draining(procs: Processes, tmp_path: Path) -> None:
    stub = procs.stub("--hold", "5")
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], {
        "sequence_slots": 3, "max_in_flight": 2, "queue_depth": 4, "queue_timeout_seconds": 30})
        + upstream_toml("plain", procs.stub().url, ["plain"]))
    errors: list[str] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 390, "height": 844})  # a phone
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(gw.ops_url + "/status")
            assert await _figures(page) == ("0", "0", "2")
            in_flight: list[int] = []
            depth: list[int] = []
            async with httpx.AsyncClient(timeout=60) as client:
                async def watch(until: float) -> None:
                    while time.monotonic() < until:
                        flying, queued, _ = await _figures(page)
                        in_flight.append(int(flying))
                        depth.append(int(queued))
                        await asyncio.sleep(0.1)

                requests = []
                for i in range(6):  # 2 admitted at once, then 4 queued one by one
                    requests.append(asyncio.create_task(client.post(f"{gw.url}/v1/chat/completions", json=CHAT)))
                    await watch(time.monotonic() + (0.05 if i < 2 else 1.1))
                    if i == 5:
                        full = await page.screenshot(full_page=True)
                watch_all = asyncio.create_task(watch(time.monotonic() + 20))
                replies = await asyncio.gather(*requests)
                deadline = time.monotonic() + 5
                while depth[-1] != 0 or in_flight[-1] != 0:  # the page's last refresh after the end
                    assert time.monotonic() < deadline, (in_flight[-20:], depth[-20:])
                    await asyncio.sleep(0.1)
                watch_all.cancel()
            bar = await page.get_attribute('[data-bar="u:reasoning:queue_depth"]', "style")
            await page.screenshot(path=str(tmp_path / "status-page-idle.png"), full_page=True)
        finally:
            await browser.close()
    (tmp_path / "status-page-full.png").write_bytes(full)
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copy(tmp_path / "status-page-full.png", artifacts / "status-page-full.png")
    assert [r.status_code for r in replies] == [200] * 6
    assert max(in_flight) == 2 and 2 in in_flight  # in flight reached the cap, never more
    runs = _runs(depth)
    peak = runs.index(4)
    assert len({v for v in runs[:peak] if 0 < v < 4}) >= 2, runs  # it rose step by step to the full queue...
    falling = zip(runs[peak:], runs[peak + 1:], strict=False)
    assert runs[-1] == 0 and all(a >= b for a, b in falling), runs  # ...then fell to 0
    assert bar is not None and "width:0" in bar.replace(" ", ""), bar
    assert errors == [], errors


async def test_status_page_shows_who_used_an_upstream_and_how_evenly(procs: Processes, tmp_path: Path) -> None:
    """With API keys on, two consumers' requests: the page reloads itself with a row per consumer in
    the upstream's card (shares of slot time and weighted tokens, as whole percents) and the
    fairness index, and keeps them in step with `/status.json`."""
    keys = {"alpha": new_key(), "beta": new_key()}
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text("".join(f'[consumers.{name}]\nkeys = ["{key_digest(key)}"]\n' for name, key in keys.items()))
    stub = procs.stub("--hold", "0.2", "--tokens", "4")
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], {
        "sequence_slots": 2, "max_in_flight": 1, "queue_depth": 8, "queue_timeout_seconds": 30})
        + f'\n[auth]\nmode = "required"\nkeys_file = "{keys_file}"\n')
    errors: list[str] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 390, "height": 844})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(gw.ops_url + "/status")
            assert (await page.text_content('[data-v="u:reasoning:fairness_index"]') or "").strip() == "1.00"
            async with httpx.AsyncClient(timeout=30) as client:
                await asyncio.gather(*(client.post(
                    f"{gw.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {keys[name]}"})
                    for name in ("alpha", "alpha", "alpha", "beta")))
                status = (await client.get(gw.ops_url + "/status.json")).json()["upstreams"][0]
            alpha = '[data-v="s:reasoning:alpha:token_share"]'
            await page.wait_for_selector(alpha, timeout=10_000)  # the page reloaded with the new rows
            deadline = time.monotonic() + 5
            while (await page.text_content(alpha) or "").strip() != "75%":  # 3 answers of 4 alike
                assert time.monotonic() < deadline, await page.text_content(alpha)
                await asyncio.sleep(0.1)
            beta_slots = (await page.text_content('[data-v="s:reasoning:beta:slot_share"]') or "").strip()
            index = (await page.text_content('[data-v="u:reasoning:fairness_index"]') or "").strip()
            bar = await page.get_attribute('[data-bar="s:reasoning:alpha:token_share"]', "style")
            await page.screenshot(path=str(tmp_path / "status-page-shares.png"), full_page=True)
        finally:
            await browser.close()
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    shutil.copy(tmp_path / "status-page-shares.png", ROOT / "test-artifacts" / "status-page-shares.png")
    assert [c["name"] for c in status["consumers"]] == ["alpha", "beta"]
    assert beta_slots.endswith("%") and 15 <= int(beta_slots[:-1]) <= 35, beta_slots  # about 1 of 4 slot-times
    assert index == f"{status['fairness_index']:.2f}" == "0.80", index  # services 3:1: 16 / (2 x 10)
    assert bar is not None and "width:75" in bar.replace(" ", ""), bar
    assert errors == [], errors
