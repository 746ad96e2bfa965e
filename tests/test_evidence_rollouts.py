"""The canary Deployment's objects as the rollout core reads them
(``gameday.evidence.rollouts``): pod readiness, a rollout's progress, the bad build's
patch and argument, and the ReplicaSet an undo rolls back to. Pure: kubernetes client
objects built here, no API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from gameday.evidence import rollouts as ro
from gameday.evidence.rollouts import BUILD_ANNOTATION, REVISION_ANNOTATION, RolloutError

APPS = client.AppsV1Api(client.ApiClient())  # only its serializer is used


def _pod(phase: str = "Running", ready: str = "True", deleting: bool = False) -> Any:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="p", deletion_timestamp=datetime.now(UTC) if deleting else None
        ),
        status=client.V1PodStatus(
            phase=phase, conditions=[client.V1PodCondition(type="Ready", status=ready)]
        ),
    )


def _deployment(containers: list[Any], annotations: dict[str, str] | None = None) -> Any:
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name="model-canary", generation=2, uid="dep-uid",
                                     annotations={REVISION_ANNOTATION: "3"}),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations=annotations),
                spec=client.V1PodSpec(containers=containers),
            ),
        ),
    )  # fmt: skip


def test_a_pod_is_ready_only_running_ready_and_not_being_deleted() -> None:
    assert ro.pod_ready(_pod())
    assert not ro.pod_ready(_pod(ready="False"))
    assert not ro.pod_ready(_pod(phase="Pending"))
    assert not ro.pod_ready(_pod(deleting=True))
    assert not ro.pod_ready(client.V1Pod(metadata=client.V1ObjectMeta(name="p")))


def test_a_rollout_is_done_once_every_desired_replica_is_updated_and_available() -> None:
    dep = _deployment([client.V1Container(name="model")])
    desired, _, done, words = ro.progress(dep)
    assert (desired, done) == (2, False)
    assert words == "generation 2 observed None, 0 updated / 0 available / 0 in all of 2"
    dep.status = client.V1DeploymentStatus(
        observed_generation=2, updated_replicas=2, available_replicas=2, replicas=3
    )
    assert ro.progress(dep)[2] is True
    dep.status.observed_generation = 1  # the controller has not seen the new template yet
    assert ro.progress(dep)[2] is False


def test_the_model_server_is_the_container_named_model_else_the_only_one() -> None:
    sidecar, model = client.V1Container(name="proxy"), client.V1Container(name="model")
    assert ro.model_container(_deployment([sidecar, model]), "d") == (1, model)
    assert ro.model_container(_deployment([sidecar]), "d") == (0, sidecar)
    with pytest.raises(RolloutError, match=r"deployment/d has no container named 'model'.*"
                       r"\(proxy, server\)"):  # fmt: skip
        ro.model_container(_deployment([sidecar, client.V1Container(name="server")]), "d")


def test_an_earlier_kernel_fault_flag_is_replaced_not_stacked() -> None:
    args = ["serve", "--kernel-fault", "a:1", "--port", "1", "--kernel-fault=b"]
    assert ro.without_kernel_fault(args) == ["serve", "--port", "1"]
    dep = _deployment(
        [client.V1Container(name="proxy"), client.V1Container(name="model", args=args)],
        annotations={"keep": "me"},
    )
    build, patch = ro.bad_build_patch(APPS, dep, "model-canary", "nan-logits:64")
    assert build == "kernel-fault=nan-logits:64"
    containers, annotations = patch
    assert containers["value"][0] == {"name": "proxy"}
    assert containers["value"][1]["args"] == ["serve", "--port", "1", "--kernel-fault",
                                              "nan-logits:64"]  # fmt: skip
    assert annotations == {"op": "replace", "path": "/spec/template/metadata/annotations",
                           "value": {"keep": "me", BUILD_ANNOTATION: build}}  # fmt: skip
    no_annotations = _deployment([client.V1Container(name="model")])
    assert ro.bad_build_patch(APPS, no_annotations, "m", "x")[1][1]["op"] == "add"


@pytest.mark.parametrize("raw", ["", "nan logits", ":100", "nan-logits:many"])
def test_a_malformed_kernel_fault_names_the_argument(raw: str) -> None:
    with pytest.raises(RolloutError, match=r"argument kernel_fault is .*MODE\[:MIN_PROMPT"):
        ro.parse_kernel_fault(raw)


def test_a_kernel_fault_value_and_its_ledger_params() -> None:
    value = ro.parse_kernel_fault(" fp8-kv-scale:2048 ")
    assert value == ("fp8-kv-scale:2048", "fp8-kv-scale", "2048")
    assert ro.bad_build_params("m", "", "b")["min_prompt_tokens"] == 2048  # the server's default
    assert ro.bad_build_params("m", "64", "b") == {
        "mode": "m",
        "min_prompt_tokens": 64,
        "build": "b",
    }


def test_the_version_patch_escapes_the_annotation_key() -> None:
    assert ro.version_patch("v3") == [{
        "op": "add",
        "path": "/spec/template/metadata/annotations/canarystack.io~1model-version",
        "value": "v3",
    }]  # fmt: skip


def test_the_first_container_start_is_never_before_the_patch() -> None:
    def started(at: float) -> Any:
        running = client.V1ContainerStateRunning(started_at=datetime.fromtimestamp(at, UTC))
        state = client.V1ContainerState(running=running)
        status = client.V1ContainerStatus(name="model", state=state, image="", image_id="",
                                          ready=True, restart_count=0)  # fmt: skip
        return client.V1Pod(status=client.V1PodStatus(container_statuses=[status]))

    assert ro.first_started([started(120.0), started(110.0)], 100.0) == 110.0
    assert ro.first_started([started(99.0)], 100.0) == 100.0
    assert ro.first_started([client.V1Pod(status=None)], 100.0) is None


def _replica_set(name: str, rev: str, owner: str = "dep-uid", bad: bool = False) -> Any:
    return client.V1ReplicaSet(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={REVISION_ANNOTATION: rev},
            owner_references=[client.V1OwnerReference(api_version="apps/v1", kind="Deployment",
                                                      name="d", uid=owner, controller=True)],
        ),
        spec=client.V1ReplicaSetSpec(
            selector=client.V1LabelSelector(),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(
                    labels={"app": "m", "pod-template-hash": "abc"},
                    annotations={BUILD_ANNOTATION: "kernel-fault=x"} if bad else None,
                ),
                spec=client.V1PodSpec(containers=[client.V1Container(name="model")]),
            ),
        ),
    )  # fmt: skip


def test_the_undo_goes_to_the_highest_earlier_owned_revision_without_a_bad_build() -> None:
    dep = _deployment([client.V1Container(name="model")])  # at revision 3
    sets = [
        _replica_set("good-1", "1"),
        _replica_set("bad-2", "2", bad=True),
        _replica_set("current-3", "3", bad=True),
        _replica_set("other-2", "2", owner="another-uid"),
        _replica_set("unnumbered", "x"),
    ]
    previous, current, owned = ro.previous_good(dep, sets)
    assert previous is not None
    assert (previous.metadata.name, current, owned) == ("good-1", 3, 4)
    assert ro.revision(sets[4]) == -1
    assert ro.previous_good(dep, sets[1:])[0] is None
    [patch] = ro.undo_patch(APPS, previous)
    assert patch["path"] == "/spec/template"
    assert patch["value"]["metadata"]["labels"] == {"app": "m"}  # the hash is the controller's


def test_a_rollout_to_a_build_is_done_when_every_live_pod_is_of_it_and_enough_are_ready() -> None:
    dep = _deployment([client.V1Container(name="model")])  # 2 desired
    dep.status = client.V1DeploymentStatus(
        observed_generation=2, updated_replicas=2, available_replicas=2
    )

    def pod(name: str, build: str | None, **kw: Any) -> Any:
        p = _pod(**kw)
        p.metadata.name = name
        p.metadata.annotations = {BUILD_ANNOTATION: build} if build else None
        return p

    old = pod("old", None, deleting=True)  # terminating: no longer counts
    state = ro.build_rollout(dep, [pod("a", "b1"), pod("b", "b1"), old], "b1")
    assert (state.done, [p.metadata.name for p in state.ready], state.stale) == (
        True, ["a", "b"], [])  # fmt: skip
    state = ro.build_rollout(dep, [pod("a", "b1"), pod("c", None)], "b1")
    assert (state.done, state.stale) == (False, ["c"])
    assert not ro.build_rollout(dep, [pod("a", "b1"), pod("b", "b1", ready="False")], "b1").done
    assert ro.build_rollout(dep, [pod("a", None), pod("b", None)], None).done  # the undo
