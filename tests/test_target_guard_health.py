"""The harness core under the Kubernetes namespace guard and the stack probes
(``gameday.targets.guard``, ``gameday.targets.health``): targets parsed here, the stack's
API a stub; the controls and probes over them are in tests/test_k8s_probes.py and
tests/test_probes_stack.py."""

from __future__ import annotations

from typing import Any

from gameday.api import ApiError
from gameday.targets import Replica, TargetError, parse_target
from gameday.targets.guard import activities, namespace_refusals
from gameday.targets.health import active_faults, unhealthy

K8S = parse_target({"kind": "kubernetes", "name": "staging", "namespace": "stack",
                    "urls": {"broker": "http://127.0.0.1:9"},
                    "blast_radius": {"namespaces": ["stack", "other"]}})  # fmt: skip


def test_every_activity_of_an_experiment_is_guarded() -> None:
    experiment = {
        "steady-state-hypothesis": {"probes": [{"name": "h"}]},
        "method": [{"name": "m"}, "not an activity"],
        "rollbacks": [{"name": "r"}],
    }
    assert [a["name"] for a in activities(experiment)] == ["h", "m", "r"]
    assert activities({}) == []


def test_only_the_targets_own_namespace_inside_the_blast_radius_is_allowed() -> None:
    uses = [({"name": n}, n) for n in ("stack", "kube-system", "prod", "other")]
    problems = namespace_refusals(uses, K8S)
    assert len(problems) == 3
    assert "'kube-system', which is never allowed" in problems[0]
    assert "outside the blast radius of target 'staging' (allowed: stack, other)" in problems[1]
    assert "not the target's namespace 'stack'" in problems[2]


def test_a_target_that_is_not_kubernetes_refuses_every_chaosk8s_activity() -> None:
    local = parse_target({"kind": "local"})
    assert namespace_refusals([({"name": "a"}, "stack")], local) == [
        "activity 'a' uses chaosk8s, but the target 'local' is 'local', not kubernetes"
    ]


class _Target:
    def __init__(self, missing: str | None = None) -> None:
        self.missing = missing

    def replicas(self, role: str) -> list[Replica]:
        if role == self.missing:
            raise TargetError("no pods")
        return [Replica(f"{role}-0", role, f"http://{role}")]

    def fault_headers(self, role: str) -> dict[str, str]:
        return {"role": role}


class _Api:
    def __init__(self, target: _Target) -> None:
        self.target = target

    def health_status(self, url: str) -> int:
        if url == "http://broker":
            raise ApiError("refused", url)
        return 503 if url == "http://router" else 200

    def faults(self, url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
        held = {"kind": "latency", "id": "f1", "remaining_s": 9}
        return [held] if headers["role"] == "model-canary" else []


def test_each_replica_not_answering_health_is_one_line() -> None:
    api: Any = _Api(_Target(missing="gate"))
    assert unhealthy(api) == [
        "router-0 (http://router): /health answered HTTP 503",
        "broker-0: refused",
        "gate: no pods",
    ]


def test_each_fault_held_is_one_line() -> None:
    api: Any = _Api(_Target())
    assert active_faults(api) == ["model-canary-0: latency (id f1, 9 s left)"]
