"""Router identity on the live loopback cluster (#27, finding 7): each router pod
heartbeats with its own projected service-account token, the broker asks the real
kube-apiserver who holds it (TokenReview) and lists each router pod as itself; a token of
a router pod cannot speak for another id, and no other credential lists a router at all
(the shared heartbeat Secret, another ServiceAccount's token, a router token minted for
another audience).

Skipped unless CANARY_GAMEDAY_K8S_LIVE=1 (``make test-k8s``, ``make ci-k8s``); the module
uses the running cluster and stack, and starts what is not running (deploy/loopback/
k8s-up.sh, deploy-stack.sh).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_k8s_live import (
    LOOPBACK,
    NS,
    admin_call,
    cluster_unless_up,
    kubectl_json,
    live_marks,
    run,
    sa_token,
)

BROKER = "http://127.0.0.1:18001"
pytestmark = live_marks(1200)


def _broker_up() -> bool:
    try:
        with urllib.request.urlopen(BROKER + "/health", timeout=3):
            return True
    except (OSError, urllib.error.URLError):
        return False


@pytest.fixture(scope="module")
def stack() -> Iterator[None]:
    with cluster_unless_up() as started:
        if started or not _broker_up():
            res = run(str(LOOPBACK / "deploy-stack.sh"), "--timeout-s", "400", timeout=600)
            assert res.returncode == 0, res.stderr[-3000:]
        yield


def router_pods() -> dict[str, str]:
    """Running router pods: name -> uid."""
    pods = kubectl_json("-n", NS, "get", "pods", "-l", "app.kubernetes.io/component=router")
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def listed() -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(BROKER + "/v1/routers", timeout=5) as resp:
        return {r["router_id"]: r for r in json.loads(resp.read())["routers"]}


def heartbeat(token: str, router_id: str) -> tuple[int, dict[str, Any]]:
    body = {"router_id": router_id, "release": "default", "applied_revision": None}
    req = urllib.request.Request(
        BROKER + "/v1/routers/heartbeat",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return int(e.code), json.loads(e.read())


def pod_token(account: str, pod: str, uid: str, audience: str = "canarystack-broker") -> str:
    """A token of ServiceAccount ``account`` bound to ``pod``, from the real TokenRequest
    API: what the kubelet projects into the router pod."""
    code, body = admin_call(
        "POST",
        f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
                "expirationSeconds": 600,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid},
            },
        },
    )
    assert code == 201, body
    return str(body["status"]["token"])


def test_every_router_pod_is_listed_as_itself_by_its_own_token(stack: None) -> None:
    deadline = time.monotonic() + 30
    while True:
        pods, routers = router_pods(), listed()
        if set(pods) == set(routers) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert set(routers) == set(pods) and len(pods) == 2, (routers, pods)
    assert {r["identity"] for r in routers.values()} == {"pod"}


def test_a_router_pods_token_cannot_speak_for_another_router(stack: None) -> None:
    pods = router_pods()
    name, uid = sorted(pods.items())[0]
    own = pod_token("canarystack-router", name, uid)
    other = sorted(set(pods) - {name})[0]
    for claimed in ("phantom-router-1", other):
        code, body = heartbeat(own, claimed)
        assert code == 403, body
        assert body["error"]["code"] == "router_identity"
        assert f"belongs to router pod {name!r}" in body["error"]["message"]
    assert "phantom-router-1" not in listed()


def test_no_other_credential_lists_a_router(stack: None) -> None:
    pods = router_pods()
    name, uid = sorted(pods.items())[0]
    # The shared heartbeat Secret (still the broker's, for minted credentials): refused.
    secret = kubectl_json("-n", NS, "get", "secret", "canarystack-heartbeat")
    shared = base64.b64decode(secret["data"]["token"]).decode().strip()
    code, body = heartbeat(shared, "phantom-router-2")
    assert code == 403, body
    assert "only from router-bound credentials" in body["error"]["message"]
    # Another ServiceAccount's token (the chaos runner's), and a router token minted for
    # another audience (the API server's own): the review does not vouch for them.
    for token in (
        sa_token(NS, "chaos-runner"),
        pod_token("canarystack-router", name, uid, audience="https://kubernetes.default.svc"),
    ):
        code, body = heartbeat(token, name)
        assert code == 401, body
        assert "not a router pod's" in body["error"]["message"]
    assert "phantom-router-2" not in listed()
