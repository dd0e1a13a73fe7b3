"""The operational invariants deploy/validate.py checks on rendered manifests: how the gateway
pod is wired (config, keys file, ports, probes, drain timing), the restricted Pod Security
Standard, the image agreeing with the Deployment, and the predictors' headless Services."""

from __future__ import annotations

import base64
import json
import posixpath
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
KSERVE_LABEL = "serving.kserve.io/inferenceservice"  # KServe's label on every predictor pod
if str(ROOT / "src") not in sys.path:  # check this checkout's config package, not an installed copy
    sys.path.insert(0, str(ROOT / "src"))

from adapters.outbound.keys_file import KeysFileError, parse_keys  # noqa: E402
from config import Config, ConfigError, load_config_text, parse_listen  # noqa: E402

Obj = dict[str, Any]
GATEWAY = "gateway"                                  # the Deployment's and container's name
IMAGE_CONFIG_PATH = "/etc/gateway/gateway.toml"      # deploy/Containerfile's CMD
DEFAULT_GRACE_SECONDS = 30                           # Kubernetes' default
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


class Missing(Exception):
    """A piece of the gateway's wiring the checks need is absent."""



def object_id(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')}/{where}{meta.get('name')}"



def find(objects: list[Obj], kind: str, name: str) -> Obj:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise Missing(f"no {kind} named '{name}'")



def gateway_container(deployment: Obj) -> Obj:
    containers: list[Obj] = deployment["spec"]["template"]["spec"].get("containers", [])
    for container in containers:
        if container["name"] == GATEWAY:
            return container
    raise Missing(f"{object_id(deployment)} has no container named '{GATEWAY}'")



def gateway_config(objects: list[Obj]) -> Config:
    """Follow the pod's wiring (--config path -> volume mount -> ConfigMap key) and load it."""
    deployment = find(objects, "Deployment", GATEWAY)
    container = gateway_container(deployment)
    args = container.get("args", [])
    path = args[args.index("--config") + 1] if "--config" in args[:-1] else IMAGE_CONFIG_PATH
    directory, key = posixpath.split(path)
    mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == directory), None)
    if mount is None:
        raise Missing(f"nothing is mounted at {directory} for --config {path}")
    volumes = deployment["spec"]["template"]["spec"].get("volumes", [])
    volume: Obj = next((v for v in volumes if v["name"] == mount["name"]), {})
    if "configMap" not in volume:
        raise Missing(f"volume '{mount['name']}' mounted at {directory} is not a ConfigMap")
    config_map = find(objects, "ConfigMap", volume["configMap"]["name"])
    text = config_map.get("data", {}).get(key)
    if text is None:
        raise Missing(f"{object_id(config_map)} has no key '{key}'")
    try:
        return load_config_text(text)
    except ConfigError as exc:
        raise Missing(f"{object_id(config_map)} {key}: {exc}") from None



def pre_stop_seconds(container: Obj) -> float:
    hook = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook.get("exec", {}).get("command", [])
    if len(command) == 2 and posixpath.basename(command[0]) == "sleep":
        return float(command[1])
    return 0.0



def _port_number(container: Obj, port: int | str | None) -> int | None:
    for declared in container.get("ports", []):
        if port in (declared.get("name"), declared["containerPort"]):
            return int(declared["containerPort"])
    return port if isinstance(port, int) else None



def invariant_problems(objects: list[Obj], config: Config) -> list[str]:
    problems = []
    deployment = find(objects, "Deployment", GATEWAY)
    pod = deployment["spec"]["template"]["spec"]
    container = gateway_container(deployment)
    name = object_id(deployment)

    # The kubelet SIGKILLs at the end of the grace period, which also pays for preStop.
    grace = pod.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    pre_stop, drain = pre_stop_seconds(container), config.server.drain_grace_seconds
    if grace <= pre_stop + drain:
        problems.append(
            f"{name}: terminationGracePeriodSeconds ({grace}) must exceed preStop ({pre_stop:g} s) + "
            f"server.drain_grace_seconds ({drain:g} s), or draining pods are killed mid-stream"
        )

    _, listen_port = parse_listen(config.server.listen)
    if listen_port not in [p["containerPort"] for p in container.get("ports", [])]:
        problems.append(f"{name}: no containerPort {listen_port} (server.listen = {config.server.listen})")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        http_get = container.get(probe, {}).get("httpGet", {})
        if http_get.get("path") != path:
            problems.append(f"{name}: {probe} must be GET {path}, got {http_get.get('path')!r}")
        elif _port_number(container, http_get.get("port")) != listen_port:
            problems.append(f"{name}: {probe} port {http_get.get('port')!r} is not the listen port")

    problems.extend(ops_problems(objects, config, deployment))

    for workload in objects:
        if workload["kind"] in WORKLOADS:
            problems.extend(security_problems(workload))

    replicas = deployment["spec"].get("replicas", 1)
    if replicas > 1 and config.admission.backend != "redis":
        problems.append(
            f"{name}: {replicas} replicas need [admission] backend = 'redis'; with "
            f"'{config.admission.backend}' each pod enforces its own cap"
        )
    if config.admission.backend == "redis":
        problems.extend(redis_problems(objects, config, deployment["metadata"].get("namespace")))
    if config.auth.mode == "required":
        problems.extend(keys_file_problems(objects, config, deployment))

    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    for pdb in (o for o in objects if o["kind"] == "PodDisruptionBudget"):
        selector = pdb["spec"].get("selector", {}).get("matchLabels", {})
        minimum = pdb["spec"].get("minAvailable")
        if selector.items() <= labels.items() and isinstance(minimum, int) and minimum >= replicas:
            problems.append(f"{object_id(pdb)}: minAvailable {minimum} of {replicas} replicas blocks drains")
    return problems



def security_problems(workload: Obj) -> list[str]:
    """The restricted Pod Security Standard, per container (a container's setting wins)."""
    pod = workload["spec"]["template"]["spec"]
    pod_context = pod.get("securityContext", {})
    problems = []
    for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
        context = {**pod_context, **container.get("securityContext", {})}
        where = f"{object_id(workload)} container '{container['name']}'"
        if context.get("runAsNonRoot") is not True or context.get("runAsUser") == 0:
            problems.append(f"{where}: must set runAsNonRoot: true")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: must set allowPrivilegeEscalation: false")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: must set readOnlyRootFilesystem: true")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            problems.append(f"{where}: must drop ALL capabilities")
        if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: must use seccompProfile RuntimeDefault")
    return problems



def containerfile_problems(objects: list[Obj], config: Config) -> list[str]:
    """The image and the Deployment must agree: uid, default --config path, exposed port."""
    final_stage = CONTAINERFILE.read_text(encoding="utf-8").rsplit("\nFROM ", 1)[-1]
    image: dict[str, str] = {}
    for line in final_stage.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.isupper():
            image[word] = rest.strip()
    problems = []
    pod = find(objects, "Deployment", GATEWAY)["spec"]["template"]["spec"]
    uid = pod.get("securityContext", {}).get("runAsUser")
    if uid is not None and image.get("USER", "").split(":")[0] != str(uid):
        problems.append(f"Containerfile USER {image.get('USER')!r} differs from runAsUser {uid}")
    command = json.loads(image.get("CMD", "[]"))
    if command[-2:] != ["--config", IMAGE_CONFIG_PATH]:
        problems.append(f"Containerfile CMD {command} does not end with --config {IMAGE_CONFIG_PATH}")
    if image.get("EXPOSE") != str(parse_listen(config.server.listen)[1]):
        problems.append(f"Containerfile EXPOSE {image.get('EXPOSE')!r} is not the port of server.listen")
    return problems



def ops_problems(objects: list[Obj], config: Config, deployment: Obj) -> list[str]:
    """The ops listener ([ops] listen: metrics, /status) is a containerPort that no Service
    routes (the public one must not serve metrics), and Prometheus is told to scrape it."""
    name, container = object_id(deployment), gateway_container(deployment)
    _, ops_port = parse_listen(config.ops.listen, "ops.listen", any_port=True)
    declared = next((p for p in container.get("ports", []) if p["containerPort"] == ops_port), None)
    if declared is None:
        return [f"{name}: no containerPort {ops_port} for the ops listener ([ops] listen = {config.ops.listen})"]
    problems = []
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    for service in (o for o in objects if o["kind"] == "Service"):
        if not service["spec"].get("selector") or not service["spec"]["selector"].items() <= labels.items():
            continue
        for port in service["spec"].get("ports", []):
            if port.get("targetPort", port.get("port")) in (ops_port, declared.get("name")):
                problems.append(f"{object_id(service)} routes the ops port {ops_port} ([ops] listen): "
                                "metrics and /status must stay off the public Service")
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    monitors = [o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    if not monitors and (annotations.get("prometheus.io/scrape") != "true"
                         or annotations.get("prometheus.io/port") != str(ops_port)
                         or annotations.get("prometheus.io/path", "/metrics") != "/metrics"):
        problems.append(f"{name}: the prometheus.io/scrape, /port and /path annotations must point at the ops "
                        f"listener (port {ops_port}, /metrics), or ship a ServiceMonitor/PodMonitor")
    return problems



def redis_problems(objects: list[Obj], config: Config, namespace: str | None) -> list[str]:
    """An in-cluster redis_url must name a Service rendered here; external hosts are not checked."""
    if config.admission.redis_url is None:
        return []  # Sentinels: addresses outside these manifests
    host = urlsplit(config.admission.redis_url or "").hostname or ""
    service, _, rest = host.partition(".")
    in_cluster = rest in ("", namespace, f"{namespace}.svc", f"{namespace}.svc.cluster.local")
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    if in_cluster and service not in services:
        return [f"admission.redis_url host '{host}' is not a Service in these manifests"]
    return []



def keys_file_problems(objects: list[Obj], config: Config, deployment: Obj) -> list[str]:
    """[auth] keys_file must come from a Secret mounted whole (a subPath mount never sees an
    update, so rotation and revocation would need a restart), and its content must load."""
    path = config.auth.keys_file or ""
    directory, key = posixpath.split(path)
    container = gateway_container(deployment)
    mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] in (directory, path)), None)
    if mount is None:
        return [f"auth.keys_file {path}: no volume is mounted at {directory}"]
    if mount.get("subPath") or mount["mountPath"] == path:
        return [f"auth.keys_file {path}: mounted with subPath, so updates never reach the pod; mount the whole Secret"]
    volumes = deployment["spec"]["template"]["spec"].get("volumes", [])
    volume: Obj = next((v for v in volumes if v["name"] == mount["name"]), {})
    if "secret" not in volume:
        return [f"auth.keys_file {path}: volume '{mount['name']}' is not a Secret"]
    name = volume["secret"]["secretName"]
    secret = next((o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name), None)
    if secret is None:
        return []  # managed outside these manifests (deploy/README.md)
    text = secret.get("stringData", {}).get(key)
    if text is None and key in secret.get("data", {}):
        text = base64.b64decode(secret["data"][key]).decode("utf-8")
    if text is None:
        return [f"{object_id(secret)} has no key '{key}' (auth.keys_file {path})"]
    try:
        parse_keys(text)
    except KeysFileError as exc:
        return [f"{object_id(secret)} {key}: {exc}"]
    return []



def endpoints_problems(config: Config, predictors: list[Obj]) -> list[str]:
    """Each in-cluster `[endpoints] dns` name (`SERVICE.NAMESPACE.svc...`) is a headless Service of
    deploy/k8s/predictors: `clusterIP: None` (else the name has ONE virtual IP and kube-proxy picks the
    pod per connection again), selecting KServe predictor pods, with the configured port."""
    problems = []
    for name, upstream in config.upstreams.items():
        table, key = upstream.endpoints, f"upstreams.{name}.endpoints"
        if table is None or not isinstance(table.dns, str):
            continue
        service, _, rest = table.dns.rstrip(".").partition(".")
        namespace, _, suffix = rest.partition(".")
        if suffix not in ("svc", "svc.cluster.local"):
            continue  # a name outside the cluster's Services: not ours to check
        found = next((o for o in predictors if o["kind"] == "Service" and o["metadata"]["name"] == service
                      and o["metadata"].get("namespace") == namespace), None)
        if found is None:
            problems.append(f"{key}.dns '{table.dns}': no Service {namespace}/{service} in deploy/k8s/predictors")
            continue
        spec, where = found["spec"], object_id(found)
        if spec.get("clusterIP") != "None":
            problems.append(f"{where}: must be headless (clusterIP: None) for {key}.dns: one record per pod")
        if KSERVE_LABEL not in spec.get("selector", {}):
            problems.append(f"{where}: must select the predictor pods by {KSERVE_LABEL}")
        if spec.get("publishNotReadyAddresses"):
            problems.append(f"{where}: publishNotReadyAddresses would send requests to pods that are not ready")
        ports = [p.get("targetPort", p.get("port")) for p in spec.get("ports", [])]
        if table.port not in ports:
            problems.append(f"{where}: no port {table.port} ({key}.port); it has {ports}")
    return problems
