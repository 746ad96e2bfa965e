"""The Kubernetes namespace guard's rule: which activities of an experiment that act on a
namespace of their own (``chaosk8s``) would act outside the target's blast radius.

It must never let one through: a target that is not Kubernetes refuses every one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gameday.targets.base import Target
from gameday.targets.kubernetes import FORBIDDEN_NAMESPACES, KubernetesTarget

if TYPE_CHECKING:  # an experiment as Chaos Toolkit declares it
    from chaoslib.types import Activity, Experiment


def activities(experiment: Experiment) -> list[Activity]:
    """Every activity of an experiment: its hypothesis's probes, method and rollbacks."""
    found = list((experiment.get("steady-state-hypothesis") or {}).get("probes") or [])
    found += list(experiment.get("method") or [])
    found += list(experiment.get("rollbacks") or [])
    return [a for a in found if isinstance(a, dict)]


def namespace_refusals(
    uses: Sequence[tuple[Mapping[str, object], str]], target: Target
) -> list[str]:
    """One line per (activity, the namespace it acts on) that ``target`` does not allow:
    ``kube-system`` and its siblings always, anything not in ``blast_radius.namespaces``,
    and a namespace other than the target's own; every one when the target is not
    Kubernetes."""
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
