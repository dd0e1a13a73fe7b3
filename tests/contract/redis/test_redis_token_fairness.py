"""Token fairness across processes: two `gateway serve` processes on one Redis (its own
redis-server), `fairness = "tokens"`, cap 2 shared, the stub pacing its tokens (3 ms a token),
a keys file with two consumers of equal weight. A floods 400-token answers, B 20-token ones,
through BOTH gateways, each keeping 4 requests in flight (2 through each, twice the cap: a
consumer whose queue empties for an instant while its requests hold slots is not idle and
keeps its deficit, `theld` in the ledger), all streamed. Over the
measured window, the two processes' `/metrics` together (`gateway_consumer_tokens_total`)
show their weighted tokens (input + 2 x output) within 20% of each other: the order both
processes dispatch by is one, fed by the charges of both (the one-process version is
tests/contract/admission/test_token_fairness.py).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from tests.contract.admission.e2e_support import admission
from tests.contract.admission.token_fairness_support import auth_toml, paced_stub, service_in_window
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.redis_server import RedisServer

WORKERS = 2  # requests each consumer keeps in flight through each gateway (cap 2 for all)


def _gateways(procs: Processes, redis: RedisServer, tmp_path: Path) -> list[Proc]:
    table = {**admission(2, 80, timeout=60), "fairness": '"tokens"'}
    toml = (f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
            + upstream_toml("m", paced_stub(procs).url, ["m"], table)  # type: ignore[arg-type]
            + auth_toml(tmp_path))
    return procs.together(partial(procs.gateway, toml) for _ in range(2))


@pytest.mark.slow
async def test_two_processes_give_long_and_short_answers_the_same_service(
    procs: Processes, redis: RedisServer, tmp_path: Path,
) -> None:
    a, b = await service_in_window(_gateways(procs, redis, tmp_path), WORKERS)
    assert a > 2 * (400 * 2) and b > 0, (a, b)  # several of A's answers ended in the window
    assert abs(a - b) <= 0.2 * max(a, b), (a, b)
