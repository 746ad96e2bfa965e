"""Targets: where a game day runs, described by a target file (YAML).

``load_target(path)`` returns a ``Target``: the local stack (``kind: local``, the default)
a Kubernetes namespace (``kind: kubernetes``) or a stack the project did not build
(``kind: external``). Every fault and kill goes through
``Target.check_allowed`` first (``BlastRadiusError``, a ``TargetError``, when outside the
allowlist).
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
from gameday.targets import external as _external  # noqa: F401
# isort: on
