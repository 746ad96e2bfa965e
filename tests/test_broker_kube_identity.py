"""Router identity on Kubernetes (#27, finding 7, the Kubernetes half): a router pod
heartbeats with its own projected service-account token, the broker asks the API server
who holds it (TokenReview) and lists the pod the review names, as that pod only. The
shared heartbeat credential is refused, so no credential can list a router that is not a
live pod, and a token the API server does not accept lists nothing.

The API server here is a stand-in that answers ``POST
/apis/authentication.k8s.io/v1/tokenreviews`` as kube-apiserver does (the request and
answer shapes of the TokenReview API, authentication.k8s.io/v1); the real one reviews
real pod tokens in tests/test_k8s_live_identity.py (make test-k8s).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from canarystack.common.auth import FileToken
from tests.broker_support import Api
from tests.procs import Spawner
from tests.router_support import ThreadedApp
from tests.test_broker_router_identity import beat, broker, listed

NAMESPACE = "canarystack"
ROUTER_SA = f"system:serviceaccount:{NAMESPACE}:canarystack-router"
POD_KEY = "authentication.kubernetes.io/pod-name"


def jwt(name: str) -> str:
    """A token shaped like a projected service-account token (what the broker looks for)."""
    return f"eyJhbGciOiJSUzI1NiJ9.{name}-{secrets.token_hex(4)}.c2ln"


class FakeApiServer(ThreadedApp):
    """TokenReview as kube-apiserver answers it: ``status.authenticated``, ``user`` with
    ``extra[authentication.kubernetes.io/pod-name]`` for a pod-bound token, ``audiences``."""

    what = "token review API"

    def __init__(self, broker_token: str) -> None:
        self.broker_token = broker_token
        self.known: dict[str, dict[str, Any]] = {}  # token -> status.user
        self.reviews: list[dict[str, Any]] = []
        self.failing = False
        super().__init__()

    def pod_token(self, pod: str, username: str = ROUTER_SA) -> str:
        token = jwt(pod)
        self.known[token] = {"username": username, "uid": "u", "extra": {POD_KEY: [pod]}}
        return token

    async def _review(self, request: web.Request) -> web.Response:
        if self.failing:
            return web.json_response({"kind": "Status", "code": 500}, status=500)
        if request.headers.get("Authorization") != f"Bearer {self.broker_token}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        body = await request.json()
        self.reviews.append(body)
        user = self.known.get(body["spec"]["token"])
        audiences = body["spec"].get("audiences", [])
        status: dict[str, Any] = {"authenticated": False, "error": "invalid bearer token"}
        if user is not None and audiences == ["canarystack-broker"]:
            status = {"authenticated": True, "user": user, "audiences": audiences}
        return web.json_response({**body, "status": status}, status=201)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._review)


@pytest.fixture
def api_server(tmp_path: Path) -> Any:
    own = secrets.token_urlsafe(24)
    (tmp_path / "sa-token").write_text(own + "\n")
    server = FakeApiServer(own).start()
    yield server
    server.stop()


def kube_broker(
    spawn: Spawner, tmp_path: Path, creds: Path, api_server: FakeApiServer
) -> tuple[str, Api]:
    proc, api = broker(
        spawn, tmp_path, creds,
        "--router-identity", "kubernetes", "--kube-api", api_server.url,
        "--kube-token-file", str(tmp_path / "sa-token"),
        "--router-service-account", f"{NAMESPACE}:canarystack-router",
    )  # fmt: skip
    return proc.url, api


def test_a_router_pod_heartbeats_as_itself_with_its_own_token(
    spawn: Spawner, tmp_path: Path, creds: Path, api_server: FakeApiServer
) -> None:
    url, api = kube_broker(spawn, tmp_path, creds, api_server)
    own = api_server.pod_token("router-7c9f-abcde")
    r = beat(url, own, "router-7c9f-abcde", 1)
    assert r.status_code == 200, r.text
    entry = listed(api)["router-7c9f-abcde"]
    assert entry["identity"] == "pod" and entry["applied_revision"] == 1
    # The broker asked with its own token, for the routers' audience.
    assert api_server.reviews[-1]["spec"] == {"token": own, "audiences": ["canarystack-broker"]}

    r = beat(url, own, "router-other", 1)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "router_identity"
    assert "belongs to router pod 'router-7c9f-abcde'" in r.json()["error"]["message"]
    assert "router-other" not in listed(api)
    # One review per token while its answer is fresh, not one per heartbeat.
    assert beat(url, own, "router-7c9f-abcde", 1).status_code == 200
    assert len(api_server.reviews) == 1


@pytest.mark.parametrize(
    ("token_of", "says"),
    [
        (lambda s: jwt("made-up"), "not a router pod's"),
        (
            lambda s: s.pod_token("gate-1", f"system:serviceaccount:{NAMESPACE}:default"),
            "not a router pod's",
        ),
    ],
)
def test_a_token_the_api_server_does_not_vouch_for_lists_nothing(
    spawn: Spawner,
    tmp_path: Path,
    creds: Path,
    api_server: FakeApiServer,
    token_of: Any,
    says: str,
) -> None:
    url, api = kube_broker(spawn, tmp_path, creds, api_server)
    r = beat(url, token_of(api_server), "phantom-1", 0)
    assert r.status_code == 401, r.text
    assert says in r.json()["error"]["message"]
    assert listed(api) == {}


def test_the_shared_heartbeat_credential_lists_no_router(
    spawn: Spawner, tmp_path: Path, creds: Path, api_server: FakeApiServer
) -> None:
    url, api = kube_broker(spawn, tmp_path, creds, api_server)
    shared = (creds / "heartbeat").read_text().strip()
    r = beat(url, shared, "phantom-1", 0)
    assert r.status_code == 403, r.text
    assert "takes heartbeats only from router-bound credentials" in r.json()["error"]["message"]
    assert listed(api) == {}


def test_an_api_server_that_cannot_review_is_a_503_never_a_yes(
    spawn: Spawner, tmp_path: Path, creds: Path, api_server: FakeApiServer
) -> None:
    url, api = kube_broker(spawn, tmp_path, creds, api_server)
    api_server.failing = True
    r = beat(url, api_server.pod_token("router-a"), "router-a", 0)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "identity_unavailable"
    assert "system:auth-delegator" in r.json()["error"]["message"]
    assert listed(api) == {}


def test_the_broker_refuses_kubernetes_identity_without_an_api_server(
    spawn: Spawner, tmp_path: Path, creds: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    out = subprocess.run(
        [sys.executable, "-m", "canarystack.broker", "--state-dir", str(tmp_path / "b"),
         "--credentials-dir", str(creds), "--router-identity", "kubernetes"],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--router-identity kubernetes: no API server URL: give --kube-api" in out.stderr


def test_a_rotated_token_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    token = FileToken("--broker-token-file", str(path))
    assert token() == "first-token"
    # The kubelet swaps the file in (a new inode), as for a projected volume.
    new = tmp_path / "token.new"
    new.write_text("second-token\n")
    new.replace(path)
    assert token() == "second-token"
    # A swap caught half-written (empty) keeps the last good token.
    path.write_text("")
    assert token() == "second-token"
