"""Least privilege (issue #12 item 5, docs/ARCHITECTURE.md §8): one credential per
capability, checked by real processes.

The broker runs with ``--credentials-dir`` (operator, trip, rollback, heartbeat) and refuses
every write a credential does not grant, with a 403 naming it; the gate accepts samples only
with the samples credential; the rollback executor takes a manual rollback only from the
operator; a router whose samples credential is wrong (or under the
``wrong_gate_credential`` fault) says ``gate_auth: unauthorized``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from canarystack.cluster.stack import read_events
from tests.broker_support import Api, drive_to, start_broker, trip_evidence
from tests.procs import Proc, Spawner, wait_degraded, wait_for
from tests.router_support import completion, health, start_model, start_router

NAMES = (
    "operator",
    "trip",
    "rollback",
    "heartbeat",
    "samples",
    "faults-router",
    "faults-broker",
    "faults-gate",
    "faults-rollback",
)


@pytest.fixture
def creds(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "credentials"
    folder.mkdir()
    out = {}
    for name in NAMES:
        path = folder / name
        path.write_text(secrets.token_urlsafe(24) + "\n")
        out[name] = path
    return out


def token(creds: dict[str, Path], name: str) -> str:
    return creds[name].read_text().strip()


def broker_with(spawn: Spawner, tmp_path: Path, creds: dict[str, Path]) -> Proc:
    return start_broker(
        spawn,
        tmp_path / "broker",
        "--credentials-dir",
        str(creds["operator"].parent),
        "--admin-token-file",
        str(creds["faults-broker"]),
    )


@pytest.fixture
def broker(spawn: Spawner, tmp_path: Path, creds: dict[str, Path]) -> Proc:
    return broker_with(spawn, tmp_path, creds)


def api_as(broker: Proc, creds: dict[str, Path], name: str) -> Api:
    return Api(broker.url, token(creds, name))


@pytest.fixture
def operator(broker: Proc, creds: dict[str, Path]) -> Api:
    api = api_as(broker, creds, "operator")
    for v in ("v1", "v2", "v3"):
        api.register(v)
    api.create("default", stable="v1", canary="v2", weight=5)
    return api


def refused(resp: requests.Response, credential: str, *words: str) -> dict[str, Any]:
    assert resp.status_code == 403, resp.text
    body = dict(resp.json())
    message = body["error"]["message"]
    assert f"The {credential} credential may only" in message, message
    for word in words:
        assert word in message, (word, message)
    assert body["credential"] == credential
    return body


# -- broker --------------------------------------------------------------------------------
def test_the_trip_credential_cannot_promote_or_set_weights(
    broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    gate = api_as(broker, creds, "trip")
    rev = operator.release("default")["revision"]
    refused(gate.patch("default", rev, phase="promoted"), "trip", "cannot promote")
    refused(gate.patch("default", rev, weights={"canary": 50}), "trip", "cannot set weights")
    refused(gate.patch("default", rev, canary="v3"), "trip", "change the canary version")
    refused(
        gate.write("POST", "/v1/versions", {"version": "v9", "manifest": "x", "digest": "y"}),
        "trip",
        "register versions",
    )
    # Nothing changed; and what it is for, it may do.
    assert operator.release("default")["revision"] == rev
    r = gate.patch("default", rev, phase="tripped", trip=trip_evidence())
    assert r.status_code == 200, r.text
    assert r.json()["phase"] == "tripped"
    # Once tripped, the trip credential cannot start the rollback either.
    r = gate.patch("default", r.json()["revision"], phase="rolling_back", weights={"canary": 0})
    refused(r, "trip")


def test_the_heartbeat_credential_may_only_heartbeat(
    broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    router = api_as(broker, creds, "heartbeat")
    rev = operator.release("default")["revision"]
    refused(router.patch("default", rev, weights={"canary": 0}), "heartbeat", "change releases")
    refused(
        router.write(
            "POST", "/v1/releases/default/events", {"actor": "x", "change": {"annotation": "a"}}
        ),
        "heartbeat",
        "annotate releases",
    )
    beat = {"router_id": "r-1", "release": "default", "applied_revision": rev}
    assert router.write("POST", "/v1/routers/heartbeat", beat).status_code == 200
    # The trip credential cannot pose as a router.
    refused(api_as(broker, creds, "trip").write("POST", "/v1/routers/heartbeat", beat), "trip")


def test_credentials_the_broker_does_not_hold_are_401(
    broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    rev = operator.release("default")["revision"]
    for name in ("samples", "faults-router"):
        r = api_as(broker, creds, name).patch("default", rev, phase="promoted")
        assert r.status_code == 401, r.text
        assert "Unknown credential" in r.json()["error"]["message"]
        assert (
            requests.get(
                f"{broker.url}/v1/whoami",
                headers={"Authorization": f"Bearer {token(creds, name)}"},
                timeout=5,
            ).status_code
            == 401
        )
    # The broker's own fault credential opens its /admin/faults and nothing else.
    faults = api_as(broker, creds, "faults-broker")
    assert faults.get("/admin/faults", headers=faults.headers).status_code == 200
    assert faults.patch("default", rev, phase="promoted").status_code == 403
    assert operator.get("/admin/faults", headers=operator.headers).status_code == 401
    assert operator.release("default")["phase"] == "progressing"


def test_whoami_names_the_credential(broker: Proc, creds: dict[str, Path]) -> None:
    for name in ("operator", "trip", "rollback", "heartbeat"):
        r = requests.get(
            f"{broker.url}/v1/whoami",
            headers={"Authorization": f"Bearer {token(creds, name)}"},
            timeout=5,
        )
        assert r.status_code == 200, r.text
        assert r.json() == {
            "credential": name,
            "capabilities": [name],
            "single_credential_mode": False,
        }


def test_the_rollback_credential_rolls_back_and_nothing_more(
    broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    executor = api_as(broker, creds, "rollback")
    drive_to(operator, "default", "tripped")
    rev = operator.release("default")["revision"]
    refused(
        executor.patch("default", rev, phase="rolling_back", weights={"canary": 5}),
        "rollback",
        "set the canary weight to 5",
    )
    refused(executor.patch("default", rev, canary="v3"), "rollback", "change the canary")
    # Only a release's canary can be quarantined by it.
    refused(
        executor.write("POST", "/v1/versions/v1/quarantine", {"actor": "rollback"}),
        "rollback",
        "canary of no release",
    )
    r = executor.patch("default", rev, phase="rolling_back", weights={"canary": 0})
    assert r.status_code == 200, r.text
    note = {"actor": "rollback", "change": {"annotation": "routers_applied"}}
    assert executor.write("POST", "/v1/releases/default/events", note).status_code == 201
    q = executor.write("POST", "/v1/versions/v2/quarantine", {"actor": "rollback"})
    assert q.status_code == 200, q.text
    r = executor.patch("default", operator.release("default")["revision"], phase="rolled_back")
    assert r.status_code == 200, r.text
    # It cannot start the next rollout.
    refused(
        executor.patch("default", r.json()["revision"], phase="progressing", canary="v3"),
        "rollback",
    )


def test_the_broker_refuses_two_credentials_with_one_token(
    tmp_path: Path, creds: dict[str, Path]
) -> None:
    creds["trip"].write_text(creds["operator"].read_text())
    res = subprocess.run(
        [sys.executable, "-m", "canarystack.broker", "--state-dir", str(tmp_path / "b"),
         "--credentials-dir", str(creds["operator"].parent), "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.returncode != 0
    assert "'operator' and 'trip' hold the same token" in res.stderr, res.stderr


def test_event_history_is_read_page_by_page(
    broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    for i in range(7):
        note = {"actor": "t", "change": {"annotation": f"n{i}"}}
        assert operator.write("POST", "/v1/releases/default/events", note).status_code == 201
    every = operator.events("default")
    assert len(every) == 8  # created + 7 notes
    # Pages of 3: three full pages and one short one, nothing lost or repeated.
    assert read_events(broker.url, "default", page_limit=3) == every
    assert read_events(broker.url, "default", page_limit=4) == every


# -- gate, router, rollback executor ------------------------------------------------------
def holding(
    spawn: Spawner,
    role: str,
    broker: Proc,
    creds: dict[str, Path],
    broker_credential: str,
    *extra: str,
    wait_health: bool = True,
) -> Proc:
    """The gate or rollback executor (``role``) with its own faults credential, writing
    to the broker with ``broker_credential``."""
    return spawn(
        f"canarystack.{role}",
        "--broker", broker.url,
        "--admin-token-file", str(creds[f"faults-{role}"]),
        "--broker-token-file", str(creds[broker_credential]),
        *extra,
        admin_token=None, wait_health=wait_health,
    )  # fmt: skip


def gate_with(
    spawn: Spawner,
    broker: Proc,
    creds: dict[str, Path],
    broker_credential: str = "trip",
    wait_health: bool = True,
) -> Proc:
    samples = ("--samples-token-file", str(creds["samples"]))
    return holding(
        spawn, "gate", broker, creds, broker_credential, *samples, wait_health=wait_health
    )


def router_with(
    spawn: Spawner,
    tmp_path: Path,
    model: Proc,
    broker: Proc,
    gate: Proc,
    creds: dict[str, Path],
    gate_credential: str,
) -> Proc:
    return start_router(
        spawn, tmp_path, [model.url], None, "--no-shadow",
        "--admin-token-file", str(creds["faults-router"]),
        "--broker-token-file", str(creds["heartbeat"]),
        "--gate-token-file", str(creds[gate_credential]),
        broker=broker.url, gate=gate.url, admin_token=None,
    )  # fmt: skip


def test_the_gate_refuses_the_heartbeat_credential_and_the_router_says_so(
    spawn: Spawner, tmp_path: Path, broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    gate = gate_with(spawn, broker, creds)
    r = requests.post(
        f"{gate.url}/v1/samples",
        json={"router_id": "r", "release": "default", "comparisons": [], "outcomes": []},
        headers={"Authorization": f"Bearer {token(creds, 'heartbeat')}"},
        timeout=5,
    )
    assert r.status_code == 401, r.text
    assert "samples credential" in r.json()["error"]["message"]
    model = start_model(spawn, "v1")
    router = router_with(spawn, tmp_path, model, broker, gate, creds, "heartbeat")
    assert completion(router.url).status_code == 200
    h = wait_for(
        lambda: (h := health(router))["gate_auth"] == "unauthorized" and h,
        what="the router to report the refused samples credential",
    )
    assert isinstance(h, dict)
    assert h["status"] == "ok"  # it still serves users, and says it is not heard
    assert "401" in h["gate_auth_error"]
    # Its heartbeat credential is fine at the broker.
    assert h["broker_auth"] == "ok"


def test_the_wrong_gate_credential_fault_is_refused_until_it_expires(
    spawn: Spawner, tmp_path: Path, broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    gate = gate_with(spawn, broker, creds)
    model = start_model(spawn, "v1")
    router = router_with(spawn, tmp_path, model, broker, gate, creds, "samples")
    faults = {"Authorization": f"Bearer {token(creds, 'faults-router')}"}
    assert completion(router.url).status_code == 200
    wait_for(lambda: health(router)["gate_auth"] == "ok", what="a first push accepted")
    inst = f"http://127.0.0.1:{router.extra['instance_port']}"
    r = requests.post(
        f"{inst}/admin/faults", json={"kind": "wrong_gate_credential", "ttl_s": 3},
        headers=faults, timeout=5,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    assert completion(router.url).status_code == 200
    h = wait_for(
        lambda: (h := health(router))["gate_auth"] == "unauthorized" and h,
        what="pushes refused under the fault",
    )
    assert isinstance(h, dict) and "401" in h["gate_auth_error"]
    # After the TTL the right credential goes out again and the kept batch is accepted.
    wait_for(
        lambda: (
            not requests.get(f"{inst}/admin/faults", headers=faults, timeout=5).json()["faults"]
        ),
        timeout=15,
        what="the fault to expire",
    )
    wait_for(lambda: health(router)["gate_auth"] == "ok", timeout=15, what="pushes accepted")


def test_a_manual_rollback_needs_the_operator_credential(
    spawn: Spawner, broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    operator_token = ("--operator-token-file", str(creds["operator"]))
    executor = holding(spawn, "rollback", broker, creds, "rollback", *operator_token)
    assert requests.get(f"{executor.url}/health", timeout=5).json()["status"] == "ok"
    for name in ("rollback", "faults-rollback", "trip"):
        r = requests.post(
            f"{executor.url}/v1/rollbacks/default",
            json={"reason": "x"},
            headers={"Authorization": f"Bearer {token(creds, name)}"},
            timeout=5,
        )
        assert r.status_code == 401, (name, r.text)
    assert operator.release("default")["phase"] == "progressing"
    r = requests.post(
        f"{executor.url}/v1/rollbacks/default",
        json={"reason": "operator asked"},
        headers={"Authorization": f"Bearer {token(creds, 'operator')}"},
        timeout=5,
    )
    assert r.status_code == 202, r.text
    done = wait_for(
        lambda: (rel := operator.release("default"))["phase"] == "rolled_back" and rel,
        timeout=30,
        what="the manual rollback, written with the rollback credential",
    )
    assert isinstance(done, dict) and done["canary"]["quarantined"] is True


def test_an_executor_with_the_trip_credential_is_degraded(
    spawn: Spawner, broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    executor = holding(spawn, "rollback", broker, creds, "trip", wait_health=False)
    body = wait_degraded(executor, what="the executor to say its credential is refused")
    assert any("broker_auth" in reason for reason in body["degraded_reasons"]), body


def test_a_router_with_a_heartbeat_but_no_samples_credential_refuses_to_start(
    tmp_path: Path, creds: dict[str, Path]
) -> None:
    dead = "http://127.0.0.1:9"
    res = subprocess.run(
        [sys.executable, "-m", "canarystack.router", "--port", "0",
         "--state-dir", str(tmp_path), "--baseline", dead, "--broker", dead, "--gate", dead,
         "--broker-token-file", str(creds["heartbeat"])],
        capture_output=True, text=True, timeout=30,
        env={k: v for k, v in os.environ.items() if k != "CANARYSTACK_ADMIN_TOKEN"},
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "--gate given but no credential" in res.stderr
    assert "--gate-token-file" in res.stderr and "--broker given" not in res.stderr


def test_a_gate_without_a_samples_credential_refuses_to_start(
    tmp_path: Path, creds: dict[str, Path]
) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "canarystack.gate", "--port", "0", "--broker",
         "http://127.0.0.1:9", "--broker-token-file", str(creds["trip"])],
        capture_output=True, text=True, timeout=30,
        env={k: v for k, v in os.environ.items() if k != "CANARYSTACK_ADMIN_TOKEN"},
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "no samples credential" in res.stderr and "--samples-token-file" in res.stderr


# -- the harness's side: which credential it sends ------------------------------------------
def test_a_kubernetes_target_reads_each_credential_by_name(
    tmp_path: Path, creds: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gameday.targets.base import parse_target

    base = {"kind": "kubernetes", "namespace": "ns", "urls": {"broker": "http://b:8000"}}
    folder = parse_target({**base, "credentials_dir": str(creds["operator"].parent)})
    assert folder.credential("operator") == token(creds, "operator")
    assert folder.fault_headers("gate")["Authorization"] == f"Bearer {token(creds, 'faults-gate')}"
    assert folder.operator_headers()["Authorization"] == f"Bearer {token(creds, 'operator')}"
    with pytest.raises(Exception, match="faults-model-canary"):
        folder.credential("faults-model-canary")  # not in this folder: said, not guessed
    monkeypatch.setenv("CANARYSTACK_CREDENTIAL_FAULTS_MODEL_CANARY", "from-env-0123456789")
    monkeypatch.setenv("CANARYSTACK_ADMIN_TOKEN", "single-0123456789")
    by_env = parse_target(base)
    assert by_env.credential("faults-model-canary") == "from-env-0123456789"
    assert by_env.credential("operator") == "single-0123456789"  # the single fallback


def test_a_local_target_sends_each_component_its_own_fault_credential(
    tmp_path: Path, creds: dict[str, Path]
) -> None:
    import json

    from gameday.targets.base import parse_target

    state = tmp_path / "stack"
    state.mkdir()
    (state / "stack.json").write_text(
        json.dumps(
            {
                "release": "default",
                "components": [],
                "admin_token_file": str(creds["operator"]),
                "credentials": {n: str(p) for n, p in creds.items()},
            }
        )
    )
    target = parse_target({"kind": "local", "state_dir": str(state)})
    for role in ("router", "broker", "gate", "rollback"):
        expected = f"Bearer {token(creds, f'faults-{role}')}"
        assert target.fault_headers(role)["Authorization"] == expected
    assert target.operator_headers()["Authorization"] == f"Bearer {token(creds, 'operator')}"
    with pytest.raises(Exception, match="no credential 'faults-model-canary'"):
        target.fault_headers("model-canary")


def test_a_gate_holding_the_wrong_credential_says_so_before_any_trip(
    spawn: Spawner, broker: Proc, creds: dict[str, Path], operator: Api
) -> None:
    # a botched mount: the heartbeat credential, not the trip one
    gate = gate_with(spawn, broker, creds, "heartbeat", wait_health=False)
    body = wait_degraded(gate, what="the gate to say the broker refuses its credential")
    assert "broker_auth_forbidden" in body["degraded_reasons"], body
    assert "'heartbeat'" in body["broker_auth_error"] and "trip" in body["broker_auth_error"]
    assert operator.release("default")["phase"] == "progressing"


@pytest.mark.parametrize("module", ["broker", "gate", "router", "rollback", "model", "engine"])
def test_every_components_help_says_the_admin_token_is_its_fault_credential(
    module: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"canarystack.{module}", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--admin-token-file ADMIN_TOKEN_FILE file holding this component's fault" in text
