"""Faults as the harness journals them."""

from __future__ import annotations

import enum


class FaultAction(enum.StrEnum):
    """What one journal line of the harness's fault log did."""

    INJECT = "inject"  # POST /admin/faults on a component
    CLEAR = "clear"  # DELETE /admin/faults/{id}
    KILL = "kill"  # a process or pod killed on purpose
    DEPENDENCY = "dependency"  # the shared dependency (Redis) harmed (gameday.redis_faults)
    DEPENDENCY_CLEAR = "dependency-clear"  # that harm undone
