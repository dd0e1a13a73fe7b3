"""deploy/monitoring: the PromQL of the Grafana dashboard and of the alert rules, and the
metric names they use (checked against a running gateway's /metrics)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.processes import ROOT

MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "dashboard.json"
RULES = MONITORING / "prometheus-rules.yaml"

# ---------------------------------------------------------------------------------------------
# PENDING: metrics the dashboard and rules already use that the gateway does not export yet.
# Nothing may be listed here: a name the gateway does not export is a broken panel or alert.
PENDING: frozenset[str] = frozenset()
# ---------------------------------------------------------------------------------------------

_METRIC = re.compile(r"\b(gateway_[a-z0-9_]+)\b")


def rules_spec() -> dict[str, Any]:
    """The PrometheusRule's `spec`: a plain Prometheus rules file (`groups: [...]`)."""
    spec: dict[str, Any] = yaml.safe_load(RULES.read_text())["spec"]
    return spec


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def rule_exprs() -> list[str]:
    return [rule["expr"] for group in rules_spec()["groups"] for rule in group["rules"]]


def metric_names(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in _METRIC.findall(expr)}


def dashboard_as_rules(path: Path) -> Path:
    """The dashboard's queries as recording rules, so promtool checks their PromQL too."""
    groups = [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$upstream", ".*")}
        for i, expr in enumerate(dashboard_exprs())]}]
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path
