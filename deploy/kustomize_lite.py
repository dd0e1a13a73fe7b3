"""Render a kustomization without the kustomize binary: the small subset deploy/k8s uses.

Supported: `resources` (files and directories holding a kustomization), `namespace`,
`labels` (without `includeSelectors`), `images`, and `patches` of the strategic-merge
kind (`path:` or inline `patch:`, no `target:`), including `$patch: delete`. Any other
key raises `RenderError`: an unsupported feature must fail CI, never be ignored and
render something `kubectl apply -k` would not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "PersistentVolume", "StorageClass", "PriorityClass", "IngressClass",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
# Strategic-merge keys of the lists our patches can touch (from the Kubernetes API's
# patchMergeKey tags). Other lists are replaced whole, as for unannotated fields.
# A container's ports merge on containerPort, a Service's on port.
MERGE_KEYS = {
    "containers": ("name",), "initContainers": ("name",), "env": ("name",), "volumes": ("name",),
    "volumeMounts": ("mountPath",), "ports": ("containerPort", "port"), "imagePullSecrets": ("name",),
}


class RenderError(Exception):
    """The kustomization cannot be rendered (or uses a feature this renderer lacks)."""


def render(directory: Path) -> list[Obj]:
    """The objects `kustomize build DIRECTORY` would print, in resource order."""
    file = directory / "kustomization.yaml"
    if not file.is_file():
        raise RenderError(f"{directory}: no kustomization.yaml")
    kustomization = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    unsupported = set(kustomization) - SUPPORTED_KEYS
    if unsupported:
        raise RenderError(f"{file}: unsupported by deploy/kustomize_lite.py: {sorted(unsupported)}")

    objects: list[Obj] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        objects.extend(render(path) if path.is_dir() else _load(path))
    _check_unique(objects, file)
    for index, patch in enumerate(kustomization.get("patches", [])):
        objects = _apply_patch(objects, _patch_documents(directory, patch, f"{file}: patches[{index}]"))
    if "namespace" in kustomization:
        _set_namespace(objects, kustomization["namespace"])
    for labels in kustomization.get("labels", []):
        _add_labels(objects, labels, file)
    for image in kustomization.get("images", []):
        _set_image(objects, image)
    return objects


def object_id(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')}/{where}{meta.get('name')}"


def _load(path: Path) -> list[Obj]:
    if not path.is_file():
        raise RenderError(f"resource not found: {path}")
    documents = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    for doc in documents:
        if not isinstance(doc, dict) or "kind" not in doc or "name" not in doc.get("metadata", {}):
            raise RenderError(f"{path}: every document needs kind and metadata.name")
    return documents


def _check_unique(objects: list[Obj], file: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            raise RenderError(f"{file}: {object_id(obj)} is defined twice")
        seen.add(key)


def _patch_documents(directory: Path, entry: Obj, where: str) -> Obj:
    if set(entry) - {"path", "patch"} or len(entry) != 1:
        raise RenderError(f"{where}: only a single `path` or `patch` is supported (no target/options)")
    text = (directory / entry["path"]).read_text(encoding="utf-8") if "path" in entry else entry["patch"]
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    if len(documents) != 1 or not isinstance(documents[0], dict) or "kind" not in documents[0]:
        raise RenderError(f"{where}: expected one strategic-merge patch document with a kind")
    return documents[0]


def _apply_patch(objects: list[Obj], patch: Obj) -> list[Obj]:
    meta = patch.get("metadata", {})
    matches = [
        i for i, obj in enumerate(objects)
        if obj["kind"] == patch["kind"] and obj["metadata"]["name"] == meta.get("name")
        and meta.get("namespace") in (None, obj["metadata"].get("namespace"))
    ]
    if len(matches) != 1:
        raise RenderError(f"patch for {object_id(patch)} matches {len(matches)} objects, expected 1")
    index = matches[0]
    if patch.get("$patch") == "delete":
        return objects[:index] + objects[index + 1:]
    if "$patch" in patch:
        raise RenderError(f"patch for {object_id(patch)}: only `$patch: delete` is supported")
    return [*objects[:index], _merge(objects[index], patch), *objects[index + 1:]]


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    """Strategic merge: maps merge recursively (null deletes), keyed lists merge by key."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if isinstance(key, str) and key.startswith("$"):
                raise RenderError(f"unsupported patch directive {key!r}")
            if value is None:
                out.pop(key, None)
            else:
                out[key] = _merge(base.get(key), value, key) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        out_list = list(base)
        for item in patch:
            key = next((k for k in MERGE_KEYS[field] if isinstance(item, dict) and k in item), None)
            if key is None:
                raise RenderError(f"patch item in {field!r} lacks its merge key {MERGE_KEYS[field]}")
            position = next((i for i, old in enumerate(out_list) if old.get(key) == item.get(key)), None)
            if position is None:
                out_list.append(item)
            else:
                out_list[position] = _merge(out_list[position], item, field)
        return out_list
    return patch


def _set_namespace(objects: list[Obj], namespace: str) -> None:
    for obj in objects:
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace  # kustomize renames Namespace objects too
        elif obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace


def _add_labels(objects: list[Obj], entry: Obj, file: Path) -> None:
    if entry.get("includeSelectors") or set(entry) - {"pairs", "includeSelectors", "includeTemplates"}:
        raise RenderError(f"{file}: labels supports only pairs and includeTemplates here")
    pairs = entry.get("pairs", {})
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(pairs)
        if entry.get("includeTemplates") and obj["kind"] in WORKLOADS:
            template_meta = obj["spec"]["template"].setdefault("metadata", {})
            template_meta.setdefault("labels", {}).update(pairs)


def _image_name(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def _set_image(objects: list[Obj], entry: Obj) -> None:
    for obj in objects:
        if obj["kind"] not in WORKLOADS:
            continue
        pod = obj["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            if _image_name(container["image"]) != entry["name"]:
                continue
            name = entry.get("newName", entry["name"])
            if "digest" in entry:
                container["image"] = f"{name}@{entry['digest']}"
            elif "newTag" in entry:
                container["image"] = f"{name}:{entry['newTag']}"
            else:
                rest = container["image"][len(_image_name(container["image"])):]
                container["image"] = name + rest
