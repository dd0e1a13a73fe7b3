"""deploy/: the Kubernetes manifests render with `kubectl kustomize`, match the schemas, and keep
their invariants. kubectl is real: scripts/test installs it where it is missing (scripts/ensure-kubectl)."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load_validator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_validate", ROOT / "deploy" / "validate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


validate = _load_validator()
invariants = sys.modules["manifest_invariants"]  # imported by validate.py from beside it
BASE = validate.K8S / "base"
SINGLE = validate.K8S / "overlays" / "single-replica"


def _deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return invariants.find(objects, "Deployment", "gateway")  # type: ignore[no-any-return]


@pytest.mark.parametrize("directory", validate.kustomizations(), ids=lambda p: p.name)
def test_every_kustomization_passes(directory: Path) -> None:
    objects, problems = validate.check(directory)
    assert problems == []
    assert _deployment(objects)


def test_the_script_exits_zero() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "validate.py")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   deploy/k8s/base" in result.stdout


def test_base_shares_one_cap_across_replicas_through_redis() -> None:
    objects = validate.render(BASE)
    config = invariants.gateway_config(objects)
    assert _deployment(objects)["spec"]["replicas"] == 2
    assert config.admission.backend == "redis"
    assert config.server.workers == 1
    assert {"gateway-redis"} <= {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}


def test_single_replica_overlay_drops_redis_and_the_budget() -> None:
    objects = validate.render(SINGLE)
    assert _deployment(objects)["spec"]["replicas"] == 1
    assert invariants.gateway_config(objects).admission.backend == "memory"
    names = {invariants.object_id(o) for o in objects}
    assert not any("gateway-redis" in n or n.startswith("PodDisruptionBudget") for n in names)


def test_grace_period_below_the_drain_grace_fails() -> None:
    objects = validate.render(BASE)
    _deployment(objects)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 20
    problems = invariants.invariant_problems(objects, invariants.gateway_config(objects))
    assert any("terminationGracePeriodSeconds (20) must exceed" in p for p in problems)


def test_grace_period_must_also_pay_for_the_pre_stop_sleep() -> None:
    objects = validate.render(BASE)
    _deployment(objects)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 33  # > 30, < 35
    problems = invariants.invariant_problems(objects, invariants.gateway_config(objects))
    assert any("preStop (5 s)" in p for p in problems)


def test_several_replicas_on_the_memory_ledger_fail() -> None:
    objects = validate.render(SINGLE)
    _deployment(objects)["spec"]["replicas"] = 3
    problems = invariants.invariant_problems(objects, invariants.gateway_config(objects))
    assert any("3 replicas need [admission] backend = 'redis'" in p for p in problems)


def test_redis_url_must_name_a_rendered_service() -> None:
    redis_service = "Service/llm-gateway/gateway-redis"
    objects = [o for o in validate.render(BASE) if invariants.object_id(o) != redis_service]
    problems = invariants.invariant_problems(objects, invariants.gateway_config(objects))
    assert any("redis_url host 'gateway-redis'" in p for p in problems)


def test_wrong_probe_and_root_user_fail() -> None:
    objects = validate.render(BASE)
    pod = _deployment(objects)["spec"]["template"]["spec"]
    pod["containers"][0]["readinessProbe"]["httpGet"]["path"] = "/healthz"
    pod["securityContext"]["runAsNonRoot"] = False
    problems = invariants.invariant_problems(objects, invariants.gateway_config(objects))
    assert any("readinessProbe must be GET /readyz" in p for p in problems)
    assert any("must set runAsNonRoot: true" in p for p in problems)


def test_schema_rejects_a_misspelt_field() -> None:
    objects = validate.render(BASE)
    container = _deployment(objects)["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    problems = validate.schema_problems(objects)
    assert any("'livenesProbe' was unexpected" in p for p in problems)


def test_an_invalid_gateway_toml_is_reported_by_key() -> None:
    objects = validate.render(BASE)
    config_map = invariants.find(objects, "ConfigMap", "gateway-config")
    config_map["data"]["gateway.toml"] = config_map["data"]["gateway.toml"].replace("queue_depth = 8\n", "")
    with pytest.raises(invariants.Missing, match=r"queue_depth"):
        invariants.gateway_config(objects)


def test_labels_reach_pod_templates_but_never_selectors() -> None:
    part_of = {"app.kubernetes.io/part-of": "llm-gateway"}
    objects = validate.render(BASE)
    for obj in objects:
        assert part_of.items() <= obj["metadata"]["labels"].items(), invariants.object_id(obj)
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        assert part_of.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        # Deployment selectors are immutable: a label added to them would force a delete.
        assert "app.kubernetes.io/part-of" not in deployment["spec"]["selector"]["matchLabels"]


def test_a_kustomize_error_is_reported_with_its_cause(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - missing.yaml\n")
    objects, problems = validate.check(tmp_path)
    assert objects == []
    assert len(problems) == 1 and problems[0].startswith("render: kubectl kustomize")
    assert "missing.yaml" in problems[0]


def test_a_missing_kubectl_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBECTL", str(tmp_path / "kubectl"))
    _, problems = validate.check(BASE)
    assert problems == [f"render: kubectl not found ({tmp_path / 'kubectl'}): run scripts/ensure-kubectl"]


@pytest.mark.parametrize(("version", "too_old"), [
    (None, True),          # kubectl < 1.24 does not report it (Debian bookworm's 1.20: kustomize v2.0.3)
    ("v4.5.7", True),      # kubectl 1.25/1.26
    ("v5.0.1", False),     # kubectl 1.27
    ("v5.5.0", False),
])
def test_kustomize_older_than_v5_is_refused(version: str | None, too_old: bool) -> None:
    assert validate.kustomize_too_old(version) is too_old


def test_production_requires_keys_from_a_secret_mounted_whole() -> None:
    for directory in (BASE, SINGLE):
        objects = validate.render(directory)
        config = invariants.gateway_config(objects)
        assert (config.auth.mode, config.auth.keys_file) == ("required", "/etc/gateway-keys/keys.toml")
        secret = invariants.find(objects, "Secret", "gateway-keys")
        assert "keys.toml" in secret["stringData"]
        assert invariants.keys_file_problems(objects, config, _deployment(objects)) == []


def test_a_keys_file_mounted_by_sub_path_or_invalid_fails() -> None:
    objects = validate.render(BASE)
    config = invariants.gateway_config(objects)
    mount = next(m for m in _deployment(objects)["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
                 if m["name"] == "keys")
    mount["subPath"] = "keys.toml"
    problems = invariants.invariant_problems(objects, config)
    assert any("mounted with subPath, so updates never reach the pod" in p for p in problems)
    del mount["subPath"]
    invariants.find(objects, "Secret", "gateway-keys")["stringData"]["keys.toml"] = "[consumers.a]\nkeys = [\"x\"]\n"
    problems = invariants.invariant_problems(objects, config)
    assert any("consumers.a.keys[0]" in p for p in problems)


def test_the_ops_port_is_scraped_and_never_routed_by_the_service() -> None:
    objects = validate.render(BASE)
    assert invariants.ops_problems(objects, invariants.gateway_config(objects), _deployment(objects)) == []
    service = invariants.find(objects, "Service", "gateway")
    service["spec"]["ports"].append({"name": "ops", "port": 9464, "targetPort": "ops"})
    annotations = _deployment(objects)["spec"]["template"]["metadata"]["annotations"]
    annotations["prometheus.io/port"] = "8080"
    problems = invariants.invariant_problems(objects, invariants.gateway_config(objects))
    assert any("routes the ops port 9464" in p for p in problems), problems
    assert any("must point at the ops listener" in p for p in problems), problems


def test_the_ops_port_must_be_a_container_port() -> None:
    objects = validate.render(BASE)
    container = _deployment(objects)["spec"]["template"]["spec"]["containers"][0]
    container["ports"] = [p for p in container["ports"] if p["name"] != "ops"]
    problems = invariants.invariant_problems(objects, invariants.gateway_config(objects))
    assert any("no containerPort 9464 for the ops listener" in p for p in problems), problems


def test_the_example_config_finds_replicas_through_a_headless_service_of_predictor_pods() -> None:
    config = invariants.gateway_config(validate.render(BASE))
    endpoints = config.upstreams["reasoning"].endpoints
    assert endpoints is not None and endpoints.dns == "reasoning-predictor-headless.llm-serving.svc.cluster.local"
    assert (endpoints.port, endpoints.sequence_slots, endpoints.max_in_flight) == (8080, 4, 4)
    predictors, own = validate.predictor_objects()
    assert own == ()
    service = invariants.find(predictors, "Service", "reasoning-predictor-headless")
    assert service["metadata"]["namespace"] == "llm-serving"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"serving.kserve.io/inferenceservice": "reasoning"}
    assert invariants.endpoints_problems(config, predictors) == []


def test_a_clusterip_or_missing_predictor_service_fails() -> None:
    config = invariants.gateway_config(validate.render(BASE))
    predictors = copy.deepcopy(validate.predictor_objects()[0])
    service = invariants.find(predictors, "Service", "reasoning-predictor-headless")
    del service["spec"]["clusterIP"]
    service["spec"]["selector"] = {"app": "reasoning"}
    service["spec"]["ports"][0]["targetPort"] = 8000
    problems = invariants.endpoints_problems(config, predictors)
    assert any("must be headless (clusterIP: None)" in p for p in problems)
    assert any("serving.kserve.io/inferenceservice" in p for p in problems)
    assert any("no port 8080" in p for p in problems)
    assert any("no Service llm-serving/reasoning-predictor-headless" in p
               for p in invariants.endpoints_problems(config, []))
