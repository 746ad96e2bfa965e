"""The Kubernetes namespace guard of ``probes.kubernetes``'s controls: the namespace each
``chaosk8s`` activity of an experiment acts on, judged by ``gameday.targets.guard``.

It must never let one through: no usable target, or a target that is not Kubernetes,
refuses every ``chaosk8s`` activity.
"""

from __future__ import annotations

from chaoslib import substitute
from chaoslib.exceptions import ActivityFailed
from chaoslib.types import Activity

from gameday.targets.guard import activities, namespace_refusals
from probes._context import Configuration, Secrets, get_target

__all__ = ["activities", "refused_namespaces"]

CHAOSK8S_DEFAULT_NS = "default"


def _namespace_of(
    activity: Activity, configuration: Configuration | None, secrets: Secrets | None
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
    activities: list[Activity],
    configuration: Configuration | None,
    secrets: Secrets | None = None,
) -> list[str]:
    """One line per chaosk8s activity whose namespace the target does not allow
    (``gameday.targets.guard.namespace_refusals``). ``chaosk8s`` activities take a
    namespace argument ``ns`` that defaults to ``default``; it is read after substituting
    the configuration, as Chaos Toolkit will. The harness's own activities
    (``probes.faults.kill_pod`` & co.) check the target themselves.
    """
    found = [(a, _namespace_of(a, configuration, secrets)) for a in activities]
    uses = [(a, ns) for a, ns in found if ns is not None]
    if not uses:
        return []
    try:
        target = get_target(configuration)
    except ActivityFailed as exc:
        return [f"no usable target for the chaosk8s activities: {exc}"]
    return namespace_refusals(uses, target)
