"""A fake Kubernetes API server and a fake Prometheus, for tests: real HTTP on loopback.

Where it is used, and why a live server cannot be there (issue #15): a real Kubernetes API
server now runs in ``make test-k8s`` (tests/test_k8s_live.py: the loopback cluster of
deploy/loopback, with the pod kills, the bad-build rollout and its undo, RBAC, and Argo
Rollouts / Flagger objects of real CRDs read by probes.progressive). That cluster needs
root and, once, a ~10 minute build, so it cannot run in ``make test``, which runs this fake
instead, offline, on every change (test_k8s_probes, test_k8s_target, test_k8s_experiments,
test_k8s_fresh_canary, test_k8s_gameday, test_k8s_live_hostnet, test_k8s_live_rollout).
The fake is also the only way to get answers a healthy API server will not give on demand:
a 403 on a chosen path, a pod IP that no server listens on, a Deployment that "rolls out"
at once, an object whose status says aborted while load records say otherwise at a fixed
time. The paths a real server does show (pod kills through terminate_pods and their
replacement, readiness, the bad-build rollout and its undo, RBAC, Rollout and Canary objects
with their status) are checked live in tests/test_k8s_live.py and the game days.

The few endpoints the harness uses are served from memory by a ``ThreadingHTTPServer`` on
a free port, in the JSON the real APIs speak:

- ``GET /api/v1/namespaces/{ns}/pods?labelSelector=`` (equality selectors), ``DELETE
  /api/v1/namespaces/{ns}/pods/{name}`` (the pod is gone afterwards);
- ``GET /apis/apps/v1/namespaces/{ns}/deployments[?fieldSelector=metadata.name=X]``,
  ``.../deployments/{name}``, ``.../statefulsets/{name}``;
- ``GET /apis/{group}/{version}/namespaces/{ns}/{plural}/{name}`` (custom objects: Argo
  Rollouts, Flagger canaries);
- Prometheus ``GET|POST /api/v1/query`` (answers set per PromQL expression).

Every request is recorded (method, path, query, body) so a test can assert what was, or
was not, asked. This is a fake at the true external edge: it checks that our code speaks
the API's shapes, not how a real API server or Prometheus behaves.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str = ""


def matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors: ``a=b,c==d,e!=f``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
    return True


def pod(
    name: str,
    labels: dict[str, str],
    ip: str,
    phase: str = "Running",
    namespace: str = "stack",
    terminating: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "uid": f"uid-{name}",
        "creationTimestamp": "2025-01-01T00:00:00Z",
    }
    if terminating:
        meta["deletionTimestamp"] = "2025-01-01T00:01:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "img"}]},
        "status": {
            "phase": phase,
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
        },
    }


def workload(
    kind: str,
    name: str,
    desired: int,
    ready: int,
    namespace: str = "stack",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = labels or {"app.kubernetes.io/component": name}
    spec: dict[str, Any] = {
        "replicas": desired,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": dict(labels), "annotations": dict(annotations or {})},
            "spec": {"containers": [{"name": "main", "image": "img"}]},
        },
    }
    status: dict[str, Any] = {"replicas": desired, "readyReplicas": ready}
    if kind == "Deployment":
        status["availableReplicas"] = ready
    else:
        spec["serviceName"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": spec,
        "status": {**status, "observedGeneration": 1},
    }


def prom_vector(*values: float, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Prometheus instant-vector answer with one sample per value."""
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": dict(labels or {}), "value": [1.7e9, str(v)]} for v in values],
        },
    }


@dataclass
class FakeApi:
    pods: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # ns -> name -> pod
    workloads: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    custom: dict[tuple[str, str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    promql: dict[str, dict[str, Any]] = field(default_factory=dict)
    # answers computed from the expression (for expressions with a time window in them)
    promql_fn: Callable[[str], dict[str, Any] | None] | None = None
    seen: list[Seen] = field(default_factory=list)
    # a PATCHed Deployment rolls out at once: status caught up, its pods replaced by pods
    # of the new template (what the Deployment controller and kubelets would do)
    auto_rollout: bool = True
    # the rolled-out pods use the host's network (their servers on 127.0.0.1, as on the
    # loopback cluster), so a harness call to them reaches a loopback test server
    rollout_host_network: bool = False
    # (method, path prefix) answered 403 Forbidden, as an API server does for what RBAC denies
    forbidden: set[tuple[str, str]] = field(default_factory=set)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- fixtures -------------------------------------------------------------------
    def add_pod(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self.pods.setdefault(meta["namespace"], {})[meta["name"]] = body

    def add_workload(self, body: dict[str, Any]) -> None:
        kind = {"Deployment": "deployments", "StatefulSet": "statefulsets"}[body["kind"]]
        meta = body["metadata"]
        self.workloads[(meta["namespace"], kind, meta["name"])] = body

    def add_custom(self, group: str, version: str, plural: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self.custom[(group, version, meta["namespace"], plural, meta["name"])] = body

    # --- lifecycle ------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                if raw:
                    ctype = self.headers.get("Content-Type", "")
                    if "x-www-form-urlencoded" in ctype:
                        body = {k: v[-1] for k, v in parse_qs(raw.decode()).items()}
                    else:
                        try:
                            body = json.loads(raw)
                        except ValueError:
                            body = raw.decode(errors="replace")
                ctype = self.headers.get("Content-Type", "")
                with api._lock:
                    api.seen.append(Seen(method, parts.path, query, body, ctype))
                    code, answer = api.answer(method, parts.path, query, body)
                self._send(code, answer)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the API --------------------------------------------------------------------
    @staticmethod
    def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
        return code, {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }

    def answer(
        self, method: str, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any]]:
        if any(method == m and path.startswith(pre) for m, pre in self.forbidden):
            return self._status(403, "Forbidden", f"{method} {path} is forbidden")
        p = path.strip("/").split("/")
        if p[:2] == ["api", "v1"] and len(p) >= 3 and p[2] == "query":
            return self._prometheus(query, body)
        if p[:3] == ["api", "v1", "namespaces"] and len(p) >= 5 and p[4] == "pods":
            ns = p[3]
            if len(p) == 5 and method == "GET":
                items = [
                    v
                    for v in self.pods.get(ns, {}).values()
                    if matches(v["metadata"].get("labels", {}), query.get("labelSelector", ""))
                ]
                return 200, {
                    "apiVersion": "v1",
                    "kind": "PodList",
                    "metadata": {"resourceVersion": "1"},
                    "items": sorted(items, key=lambda v: v["metadata"]["name"]),
                }
            if len(p) == 6 and method == "DELETE":
                gone = self.pods.get(ns, {}).pop(p[5], None)
                if gone is None:
                    return self._status(404, "NotFound", f'pods "{p[5]}" not found')
                gone["metadata"]["deletionTimestamp"] = "2025-01-01T00:02:00Z"
                return 200, gone
        if p[:4] == ["apis", "apps", "v1", "namespaces"] and len(p) >= 6:
            ns, kind = p[4], p[5]
            if len(p) == 7 and method == "PATCH":
                return self._patch_workload(ns, kind, p[6], body)
            if len(p) == 7 and method == "GET":
                obj = self.workloads.get((ns, kind, p[6]))
                if obj is None:
                    return self._status(404, "NotFound", f'{kind} "{p[6]}" not found')
                return 200, obj
            if len(p) == 6 and method == "GET":
                wanted = query.get("fieldSelector", "").removeprefix("metadata.name=")
                items = [
                    v
                    for (n, k, name), v in self.workloads.items()
                    if n == ns and k == kind and (not wanted or name == wanted)
                ]
                list_kind = {"deployments": "DeploymentList", "statefulsets": "StatefulSetList"}
                return 200, {
                    "apiVersion": "apps/v1",
                    "kind": list_kind[kind],
                    "metadata": {"resourceVersion": "1"},
                    "items": items,
                }
        if p[0] == "apis" and len(p) == 7 and p[3] == "namespaces" and method == "GET":
            key = (p[1], p[2], p[4], p[5], p[6])
            obj = self.custom.get(key)
            if obj is None:
                return self._status(404, "NotFound", f'{p[5]}.{p[1]} "{p[6]}" not found')
            return 200, obj
        return self._status(404, "NotFound", f"the fake API does not serve {method} {path}")

    def _patch_workload(
        self, ns: str, kind: str, name: str, ops: Any
    ) -> tuple[int, dict[str, Any]]:
        obj = self.workloads.get((ns, kind, name))
        if obj is None:
            return self._status(404, "NotFound", f'{kind} "{name}" not found')
        if not isinstance(ops, list):
            return self._status(415, "UnsupportedMediaType", "the fake takes JSON patches only")
        for op in ops:
            if op.get("op") not in ("add", "replace"):
                return self._status(422, "Invalid", f"the fake cannot {op.get('op')}")
            keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
            node = obj
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = op["value"]
        meta = obj["metadata"]
        meta["generation"] = int(meta.get("generation", 1)) + 1
        if self.auto_rollout:
            desired = obj["spec"]["replicas"]
            obj["status"].update({"observedGeneration": meta["generation"], "replicas": desired,
                                  "updatedReplicas": desired, "availableReplicas": desired,
                                  "readyReplicas": desired})  # fmt: skip
            template = obj["spec"]["template"]["metadata"]
            labels = template.get("labels", {})
            pods = self.pods.setdefault(ns, {})
            old = [n for n, v in pods.items() if matches(v["metadata"].get("labels", {}),
                   ",".join(f"{k}={v}" for k, v in labels.items()))]  # fmt: skip
            for n in old:
                del pods[n]
            for i in range(desired):
                new = pod(f"{name}-g{meta['generation']}-{i}", dict(labels), f"10.9.0.{i + 1}",
                          namespace=ns)  # fmt: skip
                new["metadata"]["annotations"] = dict(template.get("annotations", {}))
                if self.rollout_host_network:
                    new["spec"]["hostNetwork"] = True
                # the new pod's container started now (whole seconds, as the API says)
                started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                new["status"]["containerStatuses"] = [
                    {"name": "main", "image": "img", "imageID": "img", "ready": True,
                     "restartCount": 0, "state": {"running": {"startedAt": started}}}
                ]  # fmt: skip
                pods[new["metadata"]["name"]] = new
        return 200, obj

    def _prometheus(self, query: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        params = dict(query)
        if isinstance(body, dict):
            params.update(body)
        expr = params.get("query", "")
        answer = self.promql.get(expr)
        if answer is None and self.promql_fn is not None:
            answer = self.promql_fn(expr)
        if answer is None:
            return 400, {
                "status": "error",
                "errorType": "bad_data",
                "error": f"the fake Prometheus has no answer for {expr!r}",
            }
        return 200, answer

    def api_requests(self) -> list[Seen]:
        """Requests to the Kubernetes API (not Prometheus)."""
        return [s for s in self.seen if not s.path.startswith("/api/v1/query")]

    def prometheus_queries(self) -> list[str]:
        out = []
        for s in self.seen:
            if s.path.startswith("/api/v1/query"):
                params = {**s.query, **(s.body if isinstance(s.body, dict) else {})}
                out.append(str(params.get("query")))
        return out


CLIENT_ENV_DROPPED = (
    "CHAOSTOOLKIT_IN_POD",
    "KUBERNETES_CONTEXT",
    "KUBERNETES_API_KEY",
    "KUBERNETES_CERT_FILE",
    "KUBERNETES_USERNAME",
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
)


def client_env(api: FakeApi, missing_kubeconfig: Path) -> dict[str, str | None]:
    """Environment that makes chaostoolkit-kubernetes talk to ``api``: no kubeconfig (a
    path that does not exist, so ~/.kube/config cannot interfere), not in a pod, and
    ``KUBERNETES_HOST`` at the fake. None means "unset"."""
    env: dict[str, str | None] = {v: None for v in CLIENT_ENV_DROPPED}
    env["KUBECONFIG"] = str(missing_kubeconfig)
    env["KUBERNETES_HOST"] = api.url
    return env


def serve_fake(api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    """For a fixture (``yield from``): ``api`` started, this process's Kubernetes client
    pointed at it (``point_client_at``), stopped after."""
    api.start()
    try:
        point_client_at(api, tmp_path / "no-kubeconfig", monkeypatch)
        yield api
    finally:
        api.stop()


def point_client_at(
    api: FakeApi, missing_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Put ``client_env`` into this process's environment (``monkeypatch`` undoes it)."""
    for var, value in client_env(api, missing_kubeconfig).items():
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
