"""Token fairness end to end: a real gateway (`fairness = "tokens"`, cap 2), the stub pacing
its tokens like a GPU (`--chunk-delay`, 3 ms a token), a keys file with two consumers of equal
weight. A floods 400-token answers, B 20-token ones, each keeping 4 requests in flight (twice
the cap, as a real client would), all streamed. Over the measured window, `/metrics`
(`gateway_consumer_tokens_total`) shows their weighted tokens (input + 2 x output) within 20%
of each other: B's requests were dispatched about twenty times as often. Under `fair` (by
requests) A would get about twenty times B's tokens.

With twice the cap in flight B often has nothing queued for an instant (its two running
requests end, its two queued ones are dispatched, the next two arrive a moment later) while
it still holds both slots: it is not idle, so it keeps the deficit it is catching up on. Were
it lifted to A's service each time, A would get about twice B's tokens (measured 1.6 to 2.2x
here, in every run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.contract.admission.e2e_support import admission
from tests.contract.admission.token_fairness_support import auth_toml, paced_stub, service_in_window
from tests.support.processes import Proc, Processes, upstream_toml

WORKERS = 4  # requests each consumer keeps in flight (twice the cap: both usually have some waiting)


def _gateway(procs: Processes, tmp_path: Path) -> Proc:
    table = {**admission(2, 40, timeout=60), "fairness": '"tokens"'}
    toml = upstream_toml("m", paced_stub(procs).url, ["m"], table)  # type: ignore[arg-type]
    return procs.gateway(toml + auth_toml(tmp_path))


@pytest.mark.slow
async def test_long_and_short_answers_get_the_same_service_under_tokens(procs: Processes, tmp_path: Path) -> None:
    a, b = await service_in_window([_gateway(procs, tmp_path)], WORKERS)
    assert a > 2 * (400 * 2) and b > 0, (a, b)  # several of A's answers ended in the window
    assert abs(a - b) <= 0.2 * max(a, b), (a, b)
