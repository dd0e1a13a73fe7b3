"""The chaos soak's short form; the long form is `bench/soak.py`.

A few hundred requests against an upstream capped at 4 (queue 8, small timeouts) whose
stub injects random faults (`--fault random`), mixing both surfaces, streaming and not,
with clients hanging up at random moments (queued, before the first byte, mid-stream).
Afterwards: the stub never saw more than the cap in flight, the ledger is empty, there
was no 500, every completed stream ended with its terminal frame, nothing got stuck, and
the gateway's RSS did not grow beyond a small bound. Fixed seeds.
"""

from __future__ import annotations

from pathlib import Path

from bench import soak_driver as d
from bench.soak import describe, problems, soak
from tests.support.processes import Processes

SEED = 7


async def test_chaos_soak_loses_nothing(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub(*d.stub_args(SEED, 0.2), log=log)
    gateway = procs.gateway(d.upstream_toml(stub.url), server_extra=d.SERVER_EXTRA)
    report = await soak(gateway.url, gateway.popen.pid, log, requests=400, concurrency=14, seed=SEED, warmup=100,
                        ops=gateway.ops_url)
    print(describe(report))
    figures = report.figures
    assert figures.requests == 400
    # the mix really happened: hang-ups in each phase, faults, completed streams, errors
    assert figures.hang_ups["mid-stream"] and figures.hang_ups["before-response"], describe(report)
    assert sum(report.faults.values()) >= 20 and report.final.admission.get("abandoned"), describe(report)
    assert figures.streams_terminated >= 50 and figures.streams_error_ended, describe(report)
    assert problems(report) == [], describe(report)
    assert report.stub_max_in_flight <= d.CAP
    assert (report.final.slots_in_use, report.final.queue_depth) == (0, 0)
    assert report.gateway_500s == 0 and figures.streams_unterminated == 0 and figures.stuck == 0
