"""A progressive-delivery controller's object on a Kubernetes target (Argo Rollouts'
``Rollout``, Flagger's ``Canary``): read through the CustomObjectsApi, ``get`` only, in
the target's namespace, and waited on until its status says what a check expects.

This module never changes anything in the cluster. What a status means is
``gameday.evidence.controllers``'s business.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from gameday.errors import GamedayError
from gameday.evidence import controllers as ctl
from gameday.evidence.slo import Slo
from gameday.targets.kubernetes import KubernetesTarget
from gameday.targets.waits import poll

Crd = tuple[str, str, str]  # (group, version, plural)
ARGO_ROLLOUTS: Crd = ("argoproj.io", "v1alpha1", "rollouts")
FLAGGER_CANARIES: Crd = ("flagger.app", "v1beta1", "canaries")
POLL_S = 1.0
# What a controller's status says (``ctl.ArgoView``, ``ctl.FlaggerView``).
View = TypeVar("View", bound=Mapping[str, object])


@dataclass(frozen=True)
class Controller(Generic[View]):
    """A controller's object, and the status its failed-canary check waits for."""

    crd: Crd
    status_probe: str  # the activity that reads it (named in a wrong target's error)
    check: str  # the activity that pairs its status with the traffic: the SLO's check
    view: Callable[[Mapping[str, object]], View]  # what its status says
    is_done: Callable[[View], bool]  # says the canary was stopped
    expected: str  # that status in words
    since_key: str  # the view's time of that status


ARGO: Controller[ctl.ArgoView] = Controller(
    ARGO_ROLLOUTS,
    "argo_rollout_status",
    "argo_rollout_aborted",
    ctl.argo_view,
    ctl.argo_aborted,
    "aborted (status.abort true, phase Degraded, condition RolloutAborted)",
    "aborted_at",
)
FLAGGER: Controller[ctl.FlaggerView] = Controller(
    FLAGGER_CANARIES,
    "flagger_canary_status",
    "flagger_canary_failed",
    ctl.flagger_view,
    ctl.flagger_failed,
    "phase Failed",
    "changed_at",
)


class ControllerError(GamedayError, RuntimeError):
    """A controller's object that cannot be read; the message is whole (an activity
    reports it as it is)."""


def read_object(target: KubernetesTarget, crd: Crd, name: str) -> Mapping[str, object]:
    """The custom object ``name`` of ``crd`` in the target's namespace, as the API gives it;
    ControllerError saying what to check when it is missing, forbidden or unreadable."""
    from kubernetes import client

    group, version, plural = crd
    api = client.CustomObjectsApi(target.api_client())
    try:
        obj = api.get_namespaced_custom_object(group, version, target.namespace, plural, name)
    except Exception as exc:
        status = getattr(exc, "status", None)
        if status == 404:
            raise ControllerError(
                f"{plural}.{group} {name!r} not found in namespace {target.namespace!r} "
                f"(is the controller installed and the name right?)"
            ) from None
        if status == 403:
            raise ControllerError(
                f"reading {plural}.{group} {name!r} is forbidden: the chaos runner's Role "
                "needs get on it (deploy/k8s/components/progressive-delivery)"
            ) from None
        raise ControllerError(
            f"reading {plural}.{group} {name!r} in {target.namespace!r} failed: "
            f"{getattr(exc, 'reason', None) or exc}"
        ) from None
    if not isinstance(obj, dict):
        raise ControllerError(f"{plural}.{group} {name!r}: the API answered {type(obj).__name__}")
    return obj


def wait_for_status(read: Callable[[], View], is_done: Callable[[View], bool], wait: float) -> View:
    """What ``read`` gives once ``is_done`` says so, or its last answer after ``wait``
    seconds (read every ``POLL_S``)."""
    return poll(read, is_done, time.monotonic() + wait, POLL_S)[0]


def stopped_check(
    controller: Controller[View],
    name: str,
    read: Callable[[], View],
    grace: float,
    allowed: float,
    wait: float,
    traffic_after: Callable[[float], Mapping[str, object]],
) -> Slo:
    """The controller's check: its status (``read``, its view) once it says the canary
    was stopped, waiting up to ``wait`` seconds, paired with the canary traffic served
    later than ``grace`` after it (``traffic_after`` that time); a status that never says
    so is a failed check naming expected and actual."""
    check, expected, since_key = controller.check, controller.expected, controller.since_key
    view = wait_for_status(read, controller.is_done, wait)
    done = controller.is_done(view)
    refused = ctl.status_refusal(check, name, view, done, expected, since_key, allowed, wait)
    if refused is not None:
        return refused
    at = ctl.status_time(view, since_key)
    assert at is not None  # status_refusal refuses a status without its time
    since = at + grace
    evidence = traffic_after(since)
    return ctl.paired(check, name, expected, view, since, grace, evidence, allowed)
