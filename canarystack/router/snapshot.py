"""The release config one request sees (``Snapshot``), what it makes of a release (the
effective canary weight, why a pin to the canary is refused) and its on-disk cache.

This module must never block: a snapshot is immutable, the cache is written atomically
(temp file + fsync + rename) and read once at start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict

from canary_contract.json import JsonObject, record_json
from canary_contract.phases import canary_share, is_canary_off
from canarystack.common.logs import get_logger

_log = get_logger("router")


def effective_weight(release: Mapping[str, object] | None) -> float:
    """The canary share (percent) the router applies for a release.

    Effective canary weight: 0 with no config, no canary version, a quarantined canary, or a
    phase in which the canary is off (``canary_contract.phases.CANARY_OFF``: tripped,
    rolling back, rolled back), whatever ``weights.canary`` says; else ``weights.canary``.
    """
    return canary_share(release)


def _failsafe_reason(phase: object) -> str:
    return f"fail-safe: the broker has not answered the watch (last phase {phase})"


def canary_off_reason(release: Mapping[str, object] | None, source: str = "broker") -> str | None:
    """Why the canary is off whatever a pin asks (phase, quarantine, no config, fail-safe),
    or None while an operator's weight (0 included) decides. Names the release phase.
    ``release`` is the release's JSON as the broker answered it or the cache file holds
    it (read key by key here, each key checked: a cache file may be partial)."""
    if source == "failsafe":
        return _failsafe_reason(release.get("phase") if release else None)
    if not release:
        return "no release config (phase unknown): the router has not seen the release"
    phase = release.get("phase")
    if is_canary_off(phase):
        return f"phase {phase}"
    canary = release.get("canary")
    if not isinstance(canary, dict) or not canary.get("version"):
        return f"no canary version in the release (phase {phase})"
    if canary.get("quarantined"):
        return f"canary version {canary.get('version')} is quarantined (phase {phase})"
    return None


def auth_status(status: int | None) -> str:
    """``ok`` | ``unauthorized`` (401) | ``forbidden`` (403)."""
    return {401: "unauthorized", 403: "forbidden"}.get(status or 0, "ok")


class SnapshotJson(TypedDict):
    """The config a router serves with, as its ``/health`` shows it (``config``)."""

    revision: int
    phase: str | None
    effective_canary_weight: float
    source: str
    stable_version: str | None
    canary_version: str | None
    applied_at: float
    canary_off_since: float | None
    canary_off: str | None


@dataclass(frozen=True)
class Snapshot:
    """The config one request sees: what ``of`` read off the release's JSON."""

    configured: bool  # whether a release was applied (False: no config, 0% canary)
    revision: int
    phase: str | None
    weight_pct: float
    source: str  # "broker" | "cache" | "none"
    stable_version: str | None
    canary_version: str | None
    applied_at: float  # epoch seconds
    # Epoch seconds of the apply that made the effective weight 0 (None while above 0);
    # ``of`` sets it to ``applied_at``, ``ConfigWatcher.apply`` carries an earlier one over.
    canary_off_since: float | None = None
    # Why a pin to the canary is refused (``canary_off_reason``), None while pins may pass.
    canary_off: str | None = None

    @classmethod
    def of(cls, release: JsonObject | None, source: str) -> Snapshot:
        """The snapshot of ``release`` (the broker's JSON of it, or the cache file's), as
        decoded: ``phase`` and the versions are taken as they come, unchecked."""
        now = time.time()
        if release is None:
            return cls(False, 0, None, 0.0, "none", None, None, now, now, canary_off_reason(None))
        stable = release.get("stable") if isinstance(release.get("stable"), dict) else {}
        canary = release.get("canary") if isinstance(release.get("canary"), dict) else {}
        rev = release.get("revision")
        weight_pct = effective_weight(release)
        return cls(
            configured=True,
            revision=rev if isinstance(rev, int) else 0,
            phase=release.get("phase"),
            weight_pct=weight_pct,
            source=source,
            stable_version=(stable or {}).get("version"),
            canary_version=(canary or {}).get("version"),
            applied_at=now,
            canary_off_since=now if weight_pct == 0 else None,
            canary_off=canary_off_reason(release, source),
        )

    def fail_safe(self) -> Snapshot:
        """This snapshot at 0% canary, source ``"failsafe"`` (revision kept: nothing newer
        was applied)."""
        now = time.time()
        return replace(
            self,
            weight_pct=0.0,
            source="failsafe",
            applied_at=now,
            canary_off_since=self.canary_off_since if self.weight_pct == 0 else now,
            canary_off=_failsafe_reason(self.phase),
        )

    def to_json(self) -> SnapshotJson:
        return record_json(self, SnapshotJson, effective_canary_weight=self.weight_pct)


def cache_path(state_dir: str | Path, router_id: str) -> Path:
    return Path(state_dir) / f"router-{router_id}.json"


def write_cache(path: Path, release: Mapping[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(release, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_cache(path: Path, release_name: str) -> JsonObject | None:
    """The cached release, or None when missing, unreadable or for another release."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        _log.warning("config_cache_unreadable", path=str(path), error=str(exc))
        return None
    if not isinstance(data, dict) or data.get("name") != release_name:
        _log.warning("config_cache_ignored", path=str(path), reason="not this release")
        return None
    return data
