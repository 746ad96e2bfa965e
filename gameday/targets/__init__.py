"""Targets: where a game day runs, described by a target file (YAML).

``load_target(path)`` returns a ``Target``: the local stack (``kind: local``, the default,
reading the ``stack.json`` that ``gameday stack up`` writes) or a Kubernetes namespace
(``kind: kubernetes``). A target knows the service URLs, the per-replica admin URLs, the
admin token, how to kill a pod, and its blast-radius allowlist — every fault and kill
goes through ``Target.check_allowed`` first.

Exceptions::

    TargetError                  the target file or the target itself is wrong
     └── BlastRadiusError        a component or namespace outside the allowlist
"""

from gameday.targets.base import (
    ROLES,
    BlastRadiusError,
    KilledPod,
    Replica,
    Target,
    TargetError,
    load_target,
    parse_target,
)

__all__ = [
    "ROLES",
    "BlastRadiusError",
    "KilledPod",
    "Replica",
    "Target",
    "TargetError",
    "load_target",
    "parse_target",
]

# The concrete targets join base.KINDS when imported: local first (the default kind, and
# the order a wrong kind's message lists them in).
# isort: off
from gameday.targets import local as _local  # noqa: F401
from gameday.targets import kubernetes as _kubernetes  # noqa: F401
# isort: on
