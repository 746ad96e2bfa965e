"""The canary Deployment's rollouts on a Kubernetes target: reading it, patching it and
waiting until its pods are what was asked for; and a component's workloads waited on
until they are whole after a pod kill.

It changes one Deployment only, the target's ``model-canary`` workload (blast-radius
checked before any call); it must never touch another workload. Errors: ``TargetError``
for the target, ``RolloutError`` (whole messages) for the rollout.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import requests

from canary_contract.json import JsonObject
from gameday import faults as gd_faults
from gameday.evidence.faults import bad_build_entries, is_bad_build
from gameday.evidence.rollouts import (
    BUILD_ANNOTATION,
    VERSION_ANNOTATION,
    BadBuildParams,
    BuildRollout,
    RolloutError,
    bad_build_params,
    bad_build_patch,
    build_rollout,
    first_started,
    pod_ready,
    previous_good,
    progress,
    revision,
    undo_patch,
    version_patch,
)
from gameday.evidence.slo import Slo
from gameday.evidence.workloads import WorkloadState, is_whole, ready_within
from gameday.faults import FaultLedger
from gameday.stackhttp import ApiError, JsonHttp
from gameday.targets.base import TargetError
from gameday.targets.kubernetes import KubernetesTarget
from gameday.targets.waits import poll

POLL_S = 1.0
CANARY = "model-canary"


class FreshCanary(TypedDict):
    """What ``fresh_canary`` did (start_fresh_canary's answer; fresh-canary.json holds it
    with the control's keys): ``weight`` once it set the weight, the ``previous_*`` and
    ``took_s`` once it rolled out, registered and switched to a new canary version."""

    changed: bool
    phase: str
    canary_version: str
    weight: NotRequired[int]
    previous_phase: NotRequired[str | None]
    previous_canary_version: NotRequired[str]
    took_s: NotRequired[float]


class FreshManifest(TypedDict):
    """The manifest a fresh canary version is registered with."""

    name: str
    version: str
    engine: str
    previous: str


class BuildRolledOut(TypedDict):
    """``roll_out_build``'s answer: the Deployment, the build and its pods, and when."""

    deployment: str
    build: str
    pods: list[str]
    patched_at: float
    serving_at: float
    rollout_s: float


class BuildRolloutDetail(TypedDict):
    """The ledger's detail of a bad build's entries: its rollout and when each step of it
    was seen (``container_started_at``/``listening_at`` None: not known)."""

    rollout: str
    patched_at: float
    container_started_at: float | None
    listening_at: float | None
    rolled_out_at: float
    rollout_s: float
    # hold_traffic: the canary weight held at 0 while the pods started, and when it came back
    traffic_held: NotRequired[int]
    traffic_back_at: NotRequired[float]


class BuildKept(TypedDict):
    """``undo_bad_build``'s answer when the canary was no bad build."""

    changed: Literal[False]
    deployment: str
    why: str


class BuildUndone(TypedDict):
    """``undo_bad_build``'s answer when it rolled the canary back."""

    changed: Literal[True]
    deployment: str
    undone_build: str
    to_replicaset: str
    to_revision: int
    closed_ledger_entries: int
    took_s: float


def api_failed(what: str, exc: Exception) -> RolloutError:
    """``what`` failed, with the API's status and reason."""
    return RolloutError(
        f"{what} failed: HTTP {getattr(exc, 'status', '?')} {getattr(exc, 'reason', exc)}"
    )


def ready_pods(target: KubernetesTarget, role: str) -> list[str]:
    """Names of the pods of ``role`` that are Running, Ready and not being deleted."""
    api = target.core_api()
    try:
        pods = api.list_namespaced_pod(target.namespace, label_selector=target.selector(role))
    except Exception as exc:
        raise TargetError(f"listing pods of {role} failed: {exc}") from None
    return sorted(p.metadata.name for p in pods.items if pod_ready(p))


def wait_whole(
    target: KubernetesTarget, component: str, allowed: float, poll_s: float, book: FaultLedger
) -> Slo:
    """Wait until every workload of ``component`` is whole (``is_whole``), at most
    ``allowed`` seconds; the seconds since the last pod kill of it in ``book`` (else since
    now) as ``ready_within`` judges them."""
    roles = target.expand_role(component)
    kills = [e.time for e in book.entries() if e.action == "kill" and e.component in roles]
    start = max(kills) if kills else time.time()
    since = "pod kill" if kills else "probe start"
    deadline = time.monotonic() + allowed

    def read() -> list[WorkloadState]:
        return [
            {**target.workload_status(role), "ready_pods": ready_pods(target, role)}
            for role in roles
        ]

    states, whole = poll(read, lambda states: all(is_whole(s) for s in states), deadline, poll_s)
    took = time.time() - start if whole else None
    return ready_within(component, states, allowed, took, since)


def canary_deployment(target: KubernetesTarget, what: str) -> tuple[Any, str]:
    """(AppsV1Api, name) of the target's canary Deployment, inside the blast radius."""
    from kubernetes import client

    target.check_allowed(CANARY)  # it rolls the canary's pods
    kind, name = target.workload(CANARY)
    if kind != "deployment":
        raise RolloutError(
            f"{what} rolls out a Deployment, but workloads.model-canary is {kind}/{name}"
        )
    return client.AppsV1Api(target.api_client()), name


@dataclass(frozen=True)
class CanaryChange:
    """One change of the canary Deployment: where it is, and the time it may take."""

    target: KubernetesTarget
    apps: Any  # AppsV1Api
    name: str
    wait: float  # seconds: the activity's deadline_s, capped by the activity
    t0: float  # time.monotonic() when the activity began

    @classmethod
    def begin(cls, target: KubernetesTarget, what: str, wait: float) -> CanaryChange:
        """The change ``what`` makes, within ``wait`` seconds from now."""
        t0 = time.monotonic()
        apps, name = canary_deployment(target, what)
        return cls(target, apps, name, wait, t0)

    @property
    def deadline(self) -> float:
        return self.t0 + self.wait

    def took_s(self) -> float:
        return round(time.monotonic() - self.t0, 3)


def read_deployment(target: KubernetesTarget, apps: Any, name: str) -> Any:
    """deployment/``name`` as the API has it now."""
    try:
        return apps.read_namespaced_deployment(name, target.namespace)
    except Exception as exc:
        raise api_failed(f"reading deployment/{name}", exc) from None


def patch_deployment(
    target: KubernetesTarget, apps: Any, name: str, patch: list[Any], what: str
) -> None:
    """One JSON patch of deployment/``name``; ``what`` names it in the error."""
    try:
        apps.patch_namespaced_deployment(name, target.namespace, patch)
    except Exception as exc:
        raise api_failed(what, exc) from None


def _canary_pods(target: KubernetesTarget) -> Any:
    return target.core_api().list_namespaced_pod(
        target.namespace, label_selector=target.selector(CANARY)
    )


def rolled_out_to_version(target: KubernetesTarget, name: str, version: str) -> tuple[bool, str]:
    """(done, progress): deployment/``name`` has rolled out and every live canary pod
    carries ``VERSION_ANNOTATION`` = ``version`` (none terminating)."""
    from kubernetes import client

    apps = client.AppsV1Api(target.api_client())
    dep: Any = apps.read_namespaced_deployment(name, target.namespace)
    desired, st, rolled_out, words = progress(dep)
    if not (rolled_out and (st.replicas or 0) == desired):
        return False, words
    stale = [
        p.metadata.name
        for p in _canary_pods(target).items
        if p.metadata.deletion_timestamp
        or (p.metadata.annotations or {}).get(VERSION_ANNOTATION) != version
    ]
    if stale:
        return False, f"{words}; pods not on {version} yet: {', '.join(stale)}"
    return True, words


def wait_for_version(
    target: KubernetesTarget, name: str, version: str, deadline: float, wait: float
) -> None:
    """Wait until ``rolled_out_to_version``; RolloutError naming the progress when
    ``deadline`` (monotonic) passes."""
    (_, words), done = poll(
        lambda: rolled_out_to_version(target, name, version), lambda r: r[0], deadline, POLL_S
    )
    if not done:
        raise RolloutError(
            f"the canary rollout to {version} did not finish within {wait:g} s: {words}"
        )


def wait_rolled_out(
    target: KubernetesTarget, apps: Any, name: str, build: str | None, deadline: float, wait: float
) -> list[Any]:
    """Wait until deployment/``name`` has rolled out and every live canary pod is Ready and
    carries ``BUILD_ANNOTATION`` = ``build`` (None: carries none); its pods, or
    RolloutError naming the progress when ``deadline`` (monotonic) passes."""

    def read() -> BuildRollout:
        try:
            dep: Any = apps.read_namespaced_deployment(name, target.namespace)
            pods = _canary_pods(target)
        except Exception as exc:
            raise api_failed(f"reading deployment/{name} and its pods", exc) from None
        return build_rollout(dep, pods.items, build)

    state, done = poll(read, lambda s: s.done, deadline, POLL_S / 2)
    if done:
        return state.ready
    left = f"; pods of another build: {', '.join(state.stale)}" if state.stale else ""
    raise RolloutError(
        f"the rollout of deployment/{name} did not finish within {wait:g} s: "
        f"{state.progress}, {len(state.ready)} pods of the wanted build Ready{left}"
    )


# --- the changes an activity makes -------------------------------------------------------
def settled_release(
    change: CanaryChange, read_release: Callable[[], Mapping[str, object]]
) -> Mapping[str, object]:
    """The release (``read_release``) once no rollback is pending or running
    (``tripped``/``rolling_back`` end with the rollback executor); RolloutError at the
    change's deadline."""
    release, done = poll(
        read_release,
        lambda r: r.get("phase") not in ("tripped", "rolling_back"),
        change.deadline,
        POLL_S,
    )
    if not done:
        raise RolloutError(
            f"release {change.target.release!r} is still {release.get('phase')!r} after "
            f"{change.wait:g} s: the rollback executor has not finished the last rollback"
        )
    return release


@dataclass(frozen=True)
class Broker:
    """The release reads and operator writes a fresh canary needs, as the caller makes
    them (their errors are the caller's)."""

    release: Callable[[], Mapping[str, object]]
    # (change, reason): the release after
    patch: Callable[[Mapping[str, object], str], JsonObject]
    new_version: Callable[[str], str]  # a version the broker has not seen, after this one
    register: Callable[[str, FreshManifest], None]  # (version, manifest)


def _object(value: object) -> Mapping[str, object]:
    """A JSON object of the broker's release (empty for anything else: none)."""
    return value if isinstance(value, dict) else {}


def fresh_canary(change: CanaryChange, wanted: int, broker: Broker) -> FreshCanary:
    """A release ``progressing`` with a canary that is not quarantined and the canary
    weight ``wanted``: nothing to do when it already is; else, once no rollback is pending
    (``settled_release``), a new canary version rolled out on the canary Deployment,
    registered and switched to. What was done, in a JSON object."""
    release = settled_release(change, broker.release)
    canary, stable = _object(release.get("canary")), _object(release.get("stable"))
    phase = release.get("phase")
    if phase == "progressing" and canary and not canary.get("quarantined"):
        if _object(release.get("weights")).get("canary") == wanted:
            return {"changed": False, "phase": phase, "canary_version": str(canary["version"])}
        patched = broker.patch(
            {"weights": {"canary": wanted}}, "gameday: canary weight for the run"
        )
        return {
            "changed": True,
            "phase": patched["phase"],
            "canary_version": str(canary["version"]),
            "weight": wanted,
        }
    previous = str(canary.get("version") or stable.get("version"))
    version = broker.new_version(previous)
    roll_out_version(change, version)
    manifest: FreshManifest = {"name": str(release.get("name")), "version": version,
                               "engine": "sim", "previous": previous}  # fmt: skip
    broker.register(version, manifest)
    patched = broker.patch(
        {"phase": "progressing", "canary": version, "weights": {"canary": wanted}},
        f"gameday: fresh canary {version} after {phase}",
    )
    return {
        "changed": True,
        "phase": patched["phase"],
        "previous_phase": phase if isinstance(phase, str) else None,
        "previous_canary_version": previous,
        "canary_version": version,
        "weight": wanted,
        "took_s": change.took_s(),
    }


def roll_out_version(change: CanaryChange, version: str) -> None:
    """Roll the canary Deployment out to ``version`` (its pod-template annotation) and
    wait until every pod has it."""
    target, name = change.target, change.name
    what = f"patching deployment/{name} in {target.namespace!r}"
    patch_deployment(target, change.apps, name, version_patch(version), what)
    wait_for_version(target, name, version, change.deadline, change.wait)


def serving_since(urls: Iterable[str], not_before: float) -> float | None:
    """When the earliest of the new pods' servers could first take a request, by its own
    word: the time this asked its ``/health`` minus the ``serving_s`` it answered (an
    engine pod: since its first engine could serve; a vLLM starts a minute after the
    wrapper), else minus its ``uptime_s`` (the server's age since it set itself up,
    sub-second; the API's container ``startedAt`` is whole seconds and precedes the
    interpreter's start-up). Not before ``not_before``; None when no pod answers with
    either (a foreign engine, an older server)."""
    times: list[float] = []
    with requests.Session() as session:
        http = JsonHttp(session)
        for url in urls:
            asked = time.time()  # before the answer: the estimate errs early (fail-closed)
            try:
                health = http.get_json(f"{url}/health")
            except ApiError:
                continue
            serving = health.get("serving_s")
            uptime = serving if serving is not None else health.get("uptime_s")
            if isinstance(uptime, int | float) and not isinstance(uptime, bool) and uptime >= 0:
                times.append(asked - float(uptime))
    return max(min(times), not_before) if times else None


def first_of(listening_at: float | None, started_at: float | None, rolled_out_at: float) -> float:
    """The bad build's fault time: when its server could first serve (``listening_at``),
    else when its container started, else when the rollout was seen done; never after
    that (the pods were Ready, so serving, by then)."""
    for candidate in (listening_at, started_at):
        if candidate is not None:
            return min(candidate, rolled_out_at)
    return rolled_out_at


def roll_out_bad_build(
    change: CanaryChange,
    value: str,
    mode: str,
    tokens: str,
    book: FaultLedger,
    hold: Broker | None = None,
) -> BuildRolledOut:
    """Roll the canary Deployment out to the bad build ``--kernel-fault VALUE`` and wait
    for it; ``book`` gets its entries, timed when its server could first serve
    (``serving_since``; else when its first container started, else when the rollout was
    seen done), and the broker an annotation. ``hold``: the canary's traffic held while
    its pods start (``roll_out_build``). What was done, in a JSON object."""
    dep = read_deployment(change.target, change.apps, change.name)
    build, patch = bad_build_patch(change.apps, dep, change.name, value)
    params = bad_build_params(mode, tokens, build)
    return roll_out_build(change, build, patch, params, book, hold=hold)


HOLD_REASON = (
    "gameday: canary weight 0 while the new canary pods start (a canary controller sends "
    "traffic only to ready pods)"
)


def hold_canary_traffic(broker: Broker) -> int | None:
    """Set a progressing release's canary weight to 0; the weight it had (None: nothing
    to hold, the release is not progressing or its canary has no traffic)."""
    release = broker.release()
    weight = _object(release.get("weights")).get("canary")
    if release.get("phase") != "progressing" or not isinstance(weight, int) or weight <= 0:
        return None
    broker.patch({"weights": {"canary": 0}}, HOLD_REASON)
    return weight


def give_canary_traffic_back(broker: Broker, weight: int, why: str) -> float | None:
    """Give a release whose canary weight this held at 0 its ``weight`` back, only if it
    is still progressing at 0 (a trip or an operator since then wins); when, or None."""
    release = broker.release()
    if release.get("phase") != "progressing" or _object(release.get("weights")).get("canary"):
        return None
    broker.patch({"weights": {"canary": weight}}, f"gameday: canary weight back to {weight}: {why}")
    return time.time()


def roll_out_build(
    change: CanaryChange,
    build: str,
    patch: list[Any],
    params: BadBuildParams,
    book: FaultLedger,
    admin_urls: bool = True,
    hold: Broker | None = None,
) -> BuildRolledOut:
    """Patch the canary Deployment to ``build`` (``patch``: a JSON patch that sets its pod
    template's ``BUILD_ANNOTATION`` to ``build``) and wait for the rollout; ``book`` gets
    the bad build's entries (``params``), timed when its server could first serve
    (``first_of``), and the broker an annotation (best effort). What was done, in a JSON
    object.

    ``hold`` (the release's broker): the canary's weight is 0 from before the patch until
    the new pods serve, as a canary controller sends traffic only to ready pods, and the
    fault is timed from when the weight came back if that is later. Without it, users
    meet the canary's restart (Recreate on one node): a second for the simulator, but a
    vLLM pod answers 503 for its minute of start-up, and the gate rightly trips on those
    errors before the bad build has served anything (seen on the loopback cluster)."""
    target, apps, name = change.target, change.apps, change.name
    held = hold_canary_traffic(hold) if hold is not None else None
    back_at: float | None = None
    try:
        patched_at = time.time()
        what = f"patching deployment/{name} in {target.namespace!r}"
        patch_deployment(target, apps, name, patch, what)
        pods = wait_rolled_out(target, apps, name, build, change.deadline, change.wait)
        rolled_out_at = time.time()
        started_at = first_started(pods, patched_at)
        # A foreign engine has no fault API at the pod's address (admin_urls False): the
        # ledger's entries then name none, and only the rollout's undo clears them.
        urls = {r.name: r.url for r in target.replicas(CANARY)} if admin_urls else {}
        listening_at = serving_since(urls.values(), started_at if started_at else patched_at)
        if hold is not None and held is not None:
            back_at = give_canary_traffic_back(hold, held, "the new canary pods are ready")
    finally:
        if hold is not None and held is not None and back_at is None:
            # The rollout's own error is what the run reports; the weight is put back
            # so the stack is left as found (a broker that fails here fails the next
            # step, which names it).
            with contextlib.suppress(Exception):
                give_canary_traffic_back(hold, held, "the rollout did not complete")
    served_at = first_of(listening_at, started_at, rolled_out_at)
    if back_at is not None:
        served_at = max(served_at, back_at)
    detail: BuildRolloutDetail = {
        "rollout": f"deployment/{name}",
        "patched_at": patched_at,
        "container_started_at": started_at,
        "listening_at": listening_at,
        "rolled_out_at": rolled_out_at,
        "rollout_s": round(rolled_out_at - patched_at, 3),
    }
    if held is not None and back_at is not None:
        detail["traffic_held"], detail["traffic_back_at"] = held, back_at
    names = [p.metadata.name for p in pods]
    for entry in bad_build_entries(
        [(p.metadata.name, p.metadata.uid) for p in pods], urls, params, detail, served_at
    ):
        book.append(entry)
    gd_faults.annotate(
        target,
        {
            "annotation": "fault_injected",
            "component": CANARY,
            "kind": "kernel",
            "build": build,
            "replicas": names,
        },
        reason=f"gameday rolled the canary out to a bad build ({build})",
    )
    return {
        "deployment": name,
        "build": build,
        "pods": names,
        "patched_at": patched_at,
        "serving_at": served_at,
        "rollout_s": round(served_at - patched_at, 3),
    }


def undo_bad_build(change: CanaryChange, book: FaultLedger) -> BuildKept | BuildUndone:
    """Give the canary Deployment back the pod template of its previous good ReplicaSet
    (``previous_good``) and wait for that rollout; nothing when it is no bad build. Closes
    ``book``'s bad-build entries either way. What was done, in a JSON object."""
    target, apps, name = change.target, change.apps, change.name
    dep = read_deployment(target, apps, name)
    current_build = (dep.spec.template.metadata.annotations or {}).get(BUILD_ANNOTATION)
    if current_build is None:
        close_bad_build_entries(book)
        return {"changed": False, "deployment": name, "why": "the canary is no bad build"}
    try:
        sets = apps.list_namespaced_replica_set(
            target.namespace, label_selector=target.selector(CANARY)
        ).items
    except Exception as exc:
        raise api_failed(f"listing the ReplicaSets of deployment/{name}", exc) from None
    previous, current, owned = previous_good(dep, sets)
    if previous is None:
        raise RolloutError(
            f"deployment/{name} (revision {current}) has no earlier ReplicaSet without a "
            f"bad build to roll back to ({owned} owned): roll it back by hand"
        )
    patch = undo_patch(apps, previous)
    patch_deployment(target, apps, name, patch, f"rolling deployment/{name} back")
    wait_rolled_out(target, apps, name, None, change.deadline, change.wait)
    closed = close_bad_build_entries(book)
    return {
        "changed": True,
        "deployment": name,
        "undone_build": current_build,
        "to_replicaset": previous.metadata.name,
        "to_revision": revision(previous),
        "closed_ledger_entries": closed,
        "took_s": change.took_s(),
    }


def close_bad_build_entries(book: FaultLedger) -> int:
    """A ``clear`` in ``book`` for each bad-build entry still open (so clear_faults does
    not look for them on the model server's fault API, where they never were)."""
    n = 0
    for e in book.outstanding():
        if is_bad_build(e):
            book.append(e.cleared({"rolled_back": True}))
            n += 1
    return n
