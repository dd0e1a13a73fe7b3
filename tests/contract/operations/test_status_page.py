"""`/status` in a real browser: Debian's chromium driven by Playwright for Python.

The test fills a capped upstream (cap 2) and its queue (4 places) with requests that the
stub holds 5 s each, arriving one by one, while the page is open at phone width; it reads
the figures from the DOM as the page refreshes itself from `/status.json`: in flight
reaches the cap, the queue depth rises to 4, then falls back to 0. No console error; a
screenshot is saved (the test's tmp_path and `test-artifacts/`, gitignored).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
from playwright.async_api import Page, async_playwright
from tests.support.processes import ROOT, Processes, upstream_toml

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
