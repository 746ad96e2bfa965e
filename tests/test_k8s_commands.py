"""The rendered containers' commands start a working stack — on loopback, without a cluster.

Every stack container of the rendered base (broker, model-baseline, model-canary, gate,
rollback, router) and the release-init Job is run as the pod would run it: its ``args``
through deploy/entrypoint.sh, with ``$(VAR)`` expanded from the container's environment
(the ConfigMap, the downward API: pod name, the model-version annotation) as the kubelet
does. Only what a pod gets from the cluster is swapped for loopback: listen address and
port, the Service URLs, the volumes' paths, the token file. Then a request goes through
the router (pinned to each variant) and comes back served by the version the Deployment's
annotation names. What this does not cover: images, DNS, kube-proxy, volumes, probes.

Without a cluster there is no API server to review the router pod's projected
service-account token (``--router-identity kubernetes``), so the broker runs with the
per-router credentials that stand for it off a cluster (``--router-identity tokens
--require-router-credentials``: one credential per router id, the shared one refused), and
the router's projected ``broker-token`` is a credential bound to its pod name. The live
cluster runs the TokenReview path (tests/test_k8s_live_identity.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.k8s_render import (
    CREDENTIALS,
    NO_KUBECTL,
    REPO,
    container_env,
    copy_with_token,
    credential_token,
    expand,
    kubectl,
    one,
    pod_spec,
    render,
)
from tests.procs import free_port, stopping, wait_for

pytestmark = [pytest.mark.skipif(kubectl() is None, reason=NO_KUBECTL), pytest.mark.slow]

ENTRYPOINT = REPO / "deploy" / "entrypoint.sh"
TOKEN = "a-test-token-of-enough-length-0123456789"
ORDER = [("StatefulSet", "broker"), ("Deployment", "model-baseline"),
         ("Deployment", "model-canary"), ("Deployment", "gate"), ("Deployment", "rollback"),
         ("Deployment", "router")]  # fmt: skip


class Pods:
    """Entry-point processes, each stopped by its PID."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        popen = subprocess.Popen(
            ["sh", str(ENTRYPOINT), *args], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()
        self.procs.append((name, popen))
        return popen

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for _, popen in reversed(self.procs):
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGTERM)
                try:
                    popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.kill(popen.pid, signal.SIGKILL)
                    popen.wait(timeout=5)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    with stopping(Pods(tmp_path)) as p:
        yield p


CREDENTIALS_MOUNT = "/var/run/canarystack/credentials"
ROUTER_POD = "router-7f9c-abcde"


def without_cluster_identity(args: list[str]) -> list[str]:
    """``--router-identity kubernetes`` as it stands off a cluster: per-router credentials."""
    out = list(args)
    if "--router-identity" in out:
        i = out.index("--router-identity")
        assert out[i + 1] == "kubernetes", out
        out[i : i + 2] = ["--router-identity", "tokens", "--require-router-credentials"]
    return out


def bound_router_token(creds: Path, router_id: str) -> None:
    """The router pod's ``broker-token`` (a projected service-account token on a cluster):
    here the heartbeat credential bound to its pod name, minted as an operator would."""
    done = subprocess.run(
        [sys.executable, "-m", "canarystack.broker.router_token", "--credentials-dir",
         str(creds), router_id], capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (creds / "broker-token").write_text(done.stdout)


def localize_credential(arg: str, creds: Path) -> str:
    """A path in the pod's credentials volume, as the test's folder of credentials."""
    if arg == CREDENTIALS_MOUNT or arg.startswith(CREDENTIALS_MOUNT + "/"):
        return str(creds) + arg.removeprefix(CREDENTIALS_MOUNT)
    return arg


def localize(args: list[str], port: int, tmp: Path, ready: Path, creds: Path) -> list[str]:
    """The pod's args on loopback: listen address, port, volume paths, a ready file."""
    out = []
    for i, arg in enumerate(args):
        if arg == "0.0.0.0":
            arg = "127.0.0.1"
        elif i > 0 and args[i - 1] == "--port":
            arg = str(port)
        elif arg.startswith("/var/lib/canarystack/"):
            arg = str(tmp / arg.removeprefix("/var/lib/canarystack/"))
        else:
            arg = localize_credential(arg, creds)
        out.append(arg)
    return [*out, "--ready-file", str(ready)]


def test_the_rendered_commands_start_a_stack_that_serves_both_variants(
    pods: Pods, tmp_path: Path
) -> None:
    docs = render(copy_with_token(tmp_path, TOKEN) / "base")
    # The pods' credentials volume: one file per credential (docs/ARCHITECTURE.md §8).
    creds = tmp_path / "credentials"
    creds.mkdir()
    for cred in CREDENTIALS:
        (creds / cred).write_text(credential_token(TOKEN, cred) + "\n")
    bound_router_token(creds, ROUTER_POD)
    ports = {name: free_port() for _, name in ORDER}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    loopback = {  # the Services, as loopback URLs
        "BROKER_URL": url["broker"], "GATE_URL": url["gate"], "ROUTER_URL": url["router"],
        "BASELINE_URLS": url["model-baseline"], "CANARY_URLS": url["model-canary"],
    }  # fmt: skip
    base_env = {**os.environ, "PYTHON": sys.executable, "APP_DIR": str(REPO),
                "PYTHONUNBUFFERED": "1"}  # fmt: skip
    base_env.pop("CANARYSTACK_ADMIN_TOKEN", None)
    versions: dict[str, str] = {}
    for kind, name in ORDER:
        doc = one(docs, kind, name)
        env = {**container_env(doc, docs, {"metadata.name": f"{name}-7f9c-abcde"}), **loopback}
        env["CANARYSTACK_ADMIN_TOKEN_FILE"] = localize_credential(
            env["CANARYSTACK_ADMIN_TOKEN_FILE"], creds
        )
        if name.startswith("model"):
            versions[name] = env["MODEL_VERSION"]
        (container,) = pod_spec(doc)["containers"]
        args = localize(without_cluster_identity(expand(container["args"], env)), ports[name],
                        tmp_path / name, tmp_path / f"{name}.ready", creds)  # fmt: skip
        assert not [a for a in args if "$(" in a], args  # every variable is defined
        pods.start(name, args, {**base_env, **env})
    for _, name in ORDER:
        ready = tmp_path / f"{name}.ready"

        def listening(ready: Path = ready, name: str = name) -> bool:
            return ready.exists() or _dead(pods, name)

        wait_for(listening, timeout=30, what=f"{name} to listen")
        assert not _dead(pods, name), pods.log(name)[-2000:]
    # release-init, as the Job runs it: creates the release, then leaves it alone
    job = one(docs, "Job", "release-init")
    env = {**container_env(job, docs, {}), **loopback}
    env["CANARYSTACK_ADMIN_TOKEN_FILE"] = localize_credential(
        env["CANARYSTACK_ADMIN_TOKEN_FILE"], creds
    )
    (container,) = pod_spec(job)["containers"]
    args = [localize_credential(a, creds) for a in expand(container["args"], env)]
    for expected in ("created", "already exists, left as it is"):
        done = subprocess.run(["sh", str(ENTRYPOINT), *args], env={**base_env, **env},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"release 'default' {expected}" in done.stdout
    release = requests.get(f"{url['broker']}/v1/releases/default", timeout=5).json()
    assert release["stable"]["version"] == versions["model-baseline"]
    assert release["canary"]["version"] == versions["model-canary"]
    assert release["weights"] == {"canary": 5}

    def served(variant: str) -> dict[str, Any] | None:
        resp = requests.post(
            f"{url['router']}/v1/completions",
            json={"model": "default", "prompt": "hello there", "max_tokens": 4},
            headers={"x-canary-variant": variant},
            timeout=10,
        )
        if resp.status_code != 200 or resp.headers.get("x-config-revision") in (None, "", "0"):
            return None
        return {"served_by": resp.headers["x-served-by"],
                "version": resp.headers["x-model-version"]}  # fmt: skip

    for variant, role in (("baseline", "model-baseline"), ("canary", "model-canary")):
        got = wait_for(partial(served, variant), timeout=20, what=f"a {variant} answer")
        assert got == {"served_by": variant, "version": versions[role]}
    # the router identifies itself to the broker by the pod name (downward API)
    routers = requests.get(f"{url['broker']}/v1/routers", timeout=5).json()["routers"]
    assert [r["router_id"] for r in routers] == [ROUTER_POD]
    health = json.loads(requests.get(f"{url['rollback']}/health", timeout=5).text)
    assert health["status"] == "ok"


def _dead(pods: Pods, name: str) -> bool:
    return any(n == name and p.poll() is not None for n, p in pods.procs)
