"""The Kubernetes namespace guard's rule: which ``chaosk8s`` activities of an experiment
would act on a namespace the target's blast radius does not allow.

It must never let one through: no usable target, or a target that is not Kubernetes,
refuses every ``chaosk8s`` activity.
"""

from __future__ import annotations

from chaoslib import substitute
from chaoslib.exceptions import ActivityFailed

from canary_contract.json import JsonObject
from gameday.targets.kubernetes import FORBIDDEN_NAMESPACES, KubernetesTarget
from probes._context import Configuration, Secrets, get_target

CHAOSK8S_DEFAULT_NS = "default"


def activities(experiment: JsonObject) -> list[JsonObject]:
    """Every activity of an experiment: its hypothesis's probes, method and rollbacks."""
    found = list((experiment.get("steady-state-hypothesis") or {}).get("probes") or [])
    found += list(experiment.get("method") or [])
    found += list(experiment.get("rollbacks") or [])
    return [a for a in found if isinstance(a, dict)]


def _namespace_of(
    activity: JsonObject, configuration: Configuration | None, secrets: Secrets | None
) -> str | None:
    """The namespace a chaosk8s activity acts on, or None for other activities."""
    provider = activity.get("provider") or {}
    module = str(provider.get("module") or "")
    if provider.get("type") != "python" or not module.startswith("chaosk8s"):
        return None
    arguments = provider.get("arguments") or {}
    if configuration or secrets:
        arguments = substitute(arguments, configuration, secrets)
    return str(arguments.get("ns", CHAOSK8S_DEFAULT_NS))


def refused_namespaces(
    activities: list[JsonObject],
    configuration: Configuration | None,
    secrets: Secrets | None = None,
) -> list[str]:
    """One line per chaosk8s activity whose namespace the target does not allow.

    Refused: ``kube-system`` and its siblings always, anything not in
    ``blast_radius.namespaces``, and a namespace other than the target's own. (``chaosk8s``
    activities take a namespace argument ``ns`` that defaults to ``default``; it is read
    after substituting the configuration, as Chaos Toolkit will.) The harness's own
    activities (``probes.faults.kill_pod`` & co.) check the target themselves.
    """
    uses = [(a, _namespace_of(a, configuration, secrets)) for a in activities]
    uses = [(a, ns) for a, ns in uses if ns is not None]
    if not uses:
        return []
    try:
        target = get_target(configuration)
    except ActivityFailed as exc:
        return [f"no usable target for the chaosk8s activities: {exc}"]
    if not isinstance(target, KubernetesTarget):
        return [
            f"activity {a.get('name')!r} uses chaosk8s, but the target {target.name!r} is "
            f"{target.kind!r}, not kubernetes"
            for a, _ in uses
        ]
    problems = []
    for activity, ns in uses:
        name = activity.get("name")
        if ns in FORBIDDEN_NAMESPACES:
            problems.append(f"activity {name!r} acts on namespace {ns!r}, which is never allowed")
        elif ns not in target.blast_radius.namespaces:
            allowed = ", ".join(target.blast_radius.namespaces) or "none"
            problems.append(
                f"activity {name!r} acts on namespace {ns!r}, outside the blast radius of "
                f"target {target.name!r} (allowed: {allowed})"
            )
        elif ns != target.namespace:
            problems.append(
                f"activity {name!r} acts on namespace {ns!r}, not the target's namespace "
                f"{target.namespace!r} (pass ns: ${{k8s_namespace}} or the namespace itself)"
            )
    return problems
