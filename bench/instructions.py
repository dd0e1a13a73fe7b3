"""bench/run's instruction counts: what one request at concurrency 64 costs the ceiling, ours and
keyed, in instructions (valgrind's callgrind, bench/cpu_cost.py `--callgrind`).

A request's instructions are the same on a busy machine as on an idle one, where its wall clock
is not: on a shared 2-core machine one target's requests per second move by a quarter between
rounds minutes apart. So bench/run judges its per-request c64 targets (ours over the ceiling,
keyed over ours) by these counts, and prints the requests per second beside them, not judged.

For each scenario (/v1 non-stream, /v1 stream, /llm stream) and target (the ceiling has no
Messages API: its /v1 stream stands in for /llm) one run: a stub and the target started afresh
(the target under callgrind, its instrumentation off), a warm-up of up to 200 requests, then
exactly `requests` requests at c64 (bench/loadgen.py, closed loop) counted. A throughput ratio
is the inverse ratio of instructions: ours/ceiling = the ceiling's instructions per request
over ours'.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import cpu_cost

# (scenario, target) in the order they run; the ceiling serves no /llm.
RUNS = [("v1", "ceiling"), ("v1", "ours"), ("v1", "keyed"),
        ("v1-stream", "ceiling"), ("v1-stream", "ours"), ("v1-stream", "keyed"),
        ("llm-stream", "ours"), ("llm-stream", "keyed")]
CONCURRENCY = 64
WARMUP = 200


def measure(targets: list[str], scenarios: list[str], requests: int, pin: str) -> dict[str, Any]:
    """Instructions per request by `scenario|target`, with each run's figures and why a run is
    missing (`unavailable`)."""
    record: dict[str, Any] = {"requests": requests, "concurrency": CONCURRENCY, "warmup": WARMUP,
                              "per_request": {}, "runs": {}, "unavailable": {}}
    # /llm compares to the ceiling's /v1 stream: counted when either is asked for
    asked = set(scenarios) | ({"v1-stream"} if "llm-stream" in scenarios else set())
    wanted = [(scenario, name) for scenario, name in RUNS if name in targets
              and (scenario in scenarios or (name == "ceiling" and scenario in asked))]
    for scenario, name in wanted:
        key = f"{scenario}|{name}"
        if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
            record["unavailable"][key] = "valgrind is not installed (bench/run installs it with apt-get)"
            continue
        args = cpu_cost.parse(["--target", name, "--scenario", scenario, "--callgrind", "--requests", str(requests),
                               "--warmup", str(WARMUP), "--concurrency", str(CONCURRENCY), "--pin", pin])
        try:
            summary = cpu_cost.measure(args)
        except (RuntimeError, OSError, subprocess.SubprocessError, SystemExit) as exc:
            record["unavailable"][key] = f"callgrind run failed: {exc}".replace("\n", " ")[:300]
            print(f"  instructions {scenario:<10} {name:<8} {record['unavailable'][key]}", flush=True)
            continue
        run = summary["runs"][0]
        if run["completed"] < requests or run.get("errors"):
            record["unavailable"][key] = f"{run['completed']} of {requests} requests completed, errors {run['errors']}"
        else:
            record["per_request"][key] = run["instructions_per_request"]
        record["runs"][key] = {"completed": run["completed"], "errors": run.get("errors"),
                               "instructions": run["instructions"], "dump": run["dump"],
                               "interpreter": summary["interpreter"]}
        print(f"  instructions {scenario:<10} {name:<8} {run['instructions_per_request']:>11,} per request "
              f"({run['completed']}/{requests} done)", flush=True)
    return record


def ratio(record: dict[str, Any] | None, mine: str, base: str) -> float | None:
    """`mine`'s throughput over `base`'s by instructions (keys `scenario|target`): base's
    instructions per request over mine's."""
    per = (record or {}).get("per_request", {})
    return per[base] / per[mine] if per.get(mine) and per.get(base) else None


def table(record: dict[str, Any]) -> str:
    per = record["per_request"]

    def count(key: str) -> str:
        return f"{per[key]:,}" if key in per else "n/a"

    head = f"{'scenario':<16}{'ceiling':>12}{'ours':>12}{'keyed':>12}{'ours/ceiling':>14}{'keyed/ours':>12}"
    lines = [f"instructions per request (callgrind, c{record['concurrency']}, {record['requests']:,} requests "
             f"after a warm-up of {record['warmup']}; ratios are throughput: the other's instructions over the "
             "first's)", head, "-" * len(head)]
    for scenario, label in (("v1", "/v1 non-stream"), ("v1-stream", "/v1 stream"), ("llm-stream", "/llm stream")):
        base = "v1-stream" if scenario == "llm-stream" else scenario
        ceiling = count(f"{base}|ceiling") + ("*" if scenario == "llm-stream" and f"{base}|ceiling" in per else "")
        over_ceiling = ratio(record, f"{scenario}|ours", f"{base}|ceiling")
        keyed = ratio(record, f"{scenario}|keyed", f"{scenario}|ours")
        lines.append(f"{label:<16}{ceiling:>12}{count(f'{scenario}|ours'):>12}{count(f'{scenario}|keyed'):>12}"
                     + "".join(f"{'n/a' if v is None else f'{v:.3f}x':>{w}}" for v, w in
                               ((over_ceiling, 14), (keyed, 12))))
    lines.append("* the ceiling's /v1 stream (it has no Messages API)")
    for key, why in record["unavailable"].items():
        lines.append(f"  {key.replace('|', ' ')}: n/a ({why})"[:150])
    return "\n".join(lines)
