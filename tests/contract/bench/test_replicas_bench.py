"""CI form of bench/replicas.py: two short runs of each mode. Only what holds on every machine is
asserted: with endpoints no replica ever queues a request inside (the balancer's overflow is
random: bench/replicas.py --runs 10 measures how often)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_with_endpoints_no_run_queues_inside_a_replica() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "replicas.py"), "--runs", "2"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = dict(re.findall(r"^(balancer|endpoints) +(\d+ of 2) ", done.stdout, re.MULTILINE))
    assert set(rows) == {"balancer", "endpoints"}, done.stdout
    assert rows["endpoints"] == "0 of 2"
    served = [int(n) for n in re.findall(r"run +\d: (\d+) x 200, \d+ x 503, 0 other", done.stdout)]
    assert len(served) == 4 and min(served) >= 14, done.stdout  # the cap and the queue were served, nothing failed
