"""deploy/monitoring: promtool accepts the alert rules and the dashboard's queries, and the
dashboard and rules cover what the issue asks for (the metrics exist: tests/contract/operations/
test_monitoring_metrics.py checks them against a running gateway)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml
from tests.support.monitoring import DASHBOARD, dashboard_as_rules, dashboard_exprs, rule_exprs, rules_spec


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is required (scripts/ensure-promtool installs Debian's prometheus package)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)


def test_promtool_checks_the_alert_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rules_spec()))
    done = _promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    done = _promtool("check", "rules", str(dashboard_as_rules(tmp_path / "dashboard-rules.yaml")))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alerts_and_panels_the_issue_names_are_there() -> None:
    alerts = {rule["alert"]: rule for group in rules_spec()["groups"] for rule in group["rules"]}
    assert set(alerts) == {"GatewayQueueFull", "GatewaySlotsSaturated", "GatewayUpstreamErrorRate",
                           "GatewayRedisUnreachable", "GatewayReplicaEjected", "GatewayLeaseHeartbeatFailing"}
    assert alerts["GatewayQueueFull"]["for"] == "5m" and alerts["GatewaySlotsSaturated"]["for"] == "15m"
    titles = [panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"]]
    for wanted in ("Slots in use vs cap", "Queue depth vs limit", "Queue wait p50 / p99", "503 rate by reason",
                   "Time to first token p50 / p99", "Output tokens per second", "429s per consumer",
                   "Replicas by state"):
        assert wanted in titles, wanted
    assert len(dashboard_exprs()) >= 12 and len(rule_exprs()) == 6
