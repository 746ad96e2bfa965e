"""The faults active in the proxy, each with a time-to-live the proxy enforces itself (a
dead-man switch: if the harness dies, the fault still expires).

The contract is the reference stack's (``/admin/faults``): ``POST {"kind", "ttl_s",
...params}`` (params flat, or alone under ``"params"``) -> 201 with the fault (``id``);
``GET`` -> ``{"faults": [...]}`` with ``remaining_s``; ``DELETE /admin/faults/{id}`` ->
``{"cleared": [fault]}``, 404 when unknown or expired; ``DELETE /admin/faults`` -> all.
Two rules of its own: a newer fault of a kind replaces the older one of that kind for
good, and at most ``max_faults`` faults are active at once (429 beyond).

This module must never sleep beyond a fault's life, do network I/O, or hold a fault past
its TTL.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gameday.faultproxy.errors import BadRequest, NotFound, TooManyFaults, from_validation_error
from gameday.faultproxy.kinds import FAULT_KINDS, FaultParams
from gameday.faultproxy.logs import JsonLog

DEFAULT_MAX_TTL_S = 3600.0
DEFAULT_MAX_FAULTS = 16
RESERVED_FIELDS = ("kind", "ttl_s", "params")
# How often a fault's delay checks that its fault is still active.
DELAY_POLL_S = 0.05


@dataclass
class Fault:
    id: str
    kind: str
    params: FaultParams
    ttl_s: float
    injected_at: float  # wall clock, for people
    expires_mono: float  # monotonic, for enforcement
    seq: int
    # Each fault's own random sequence (errors' draws), seeded from its params.
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def to_json(self, now_mono: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "params": self.params.model_dump(),
            "ttl_s": self.ttl_s,
            "injected_at": self.injected_at,
            "expires_at": self.injected_at + self.ttl_s,
            "remaining_s": round(max(0.0, self.expires_mono - now_mono), 3),
        }


class FaultRegistry:
    """The proxy's active faults (at most one per kind). ``clock`` (monotonic) and ``wall``
    (epoch) are parameters so tests can move time instead of sleeping."""

    def __init__(
        self,
        *,
        max_faults: int = DEFAULT_MAX_FAULTS,
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
        kinds: Mapping[str, type[FaultParams]] = FAULT_KINDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        log: JsonLog | None = None,
    ) -> None:
        if max_faults < 1:
            raise ValueError(f"max_faults is {max_faults}: it must be at least 1")
        if not (math.isfinite(max_ttl_s) and max_ttl_s > 0):
            raise ValueError(f"max_ttl_s is {max_ttl_s}: it must be a finite number > 0")
        self.kinds = dict(kinds)
        self.max_faults = max_faults
        self.max_ttl_s = max_ttl_s
        self._clock = clock
        self._wall = wall
        self._log = log or JsonLog()
        self._faults: dict[str, Fault] = {}
        self._seq = itertools.count(1)

    # -- validation ---------------------------------------------------------------
    def _parse(self, body: Mapping[str, Any]) -> tuple[str, float, FaultParams]:
        kind = body.get("kind")
        allowed = ", ".join(sorted(self.kinds))
        if kind is None:
            raise BadRequest(f"Fault body needs 'kind': one of {allowed}.", param="kind")
        if not isinstance(kind, str) or kind not in self.kinds:
            raise BadRequest(
                f"Unknown fault kind {kind!r} for the fault proxy: use one of {allowed}.",
                param="kind",
            )
        ttl = body.get("ttl_s")
        if ttl is None:
            raise BadRequest(
                "Fault body needs 'ttl_s' (seconds): every fault expires by itself; "
                f"give a number > 0 and <= {self.max_ttl_s:g}.",
                param="ttl_s",
            )
        if isinstance(ttl, bool) or not isinstance(ttl, int | float):
            raise BadRequest(f"'ttl_s' must be a number of seconds, got {ttl!r}.", param="ttl_s")
        try:
            seconds = float(ttl)
        except OverflowError:
            seconds = math.inf
        if not (math.isfinite(seconds) and 0 < seconds <= self.max_ttl_s):
            raise BadRequest(
                f"'ttl_s' is {ttl!r}: it must be > 0 and <= {self.max_ttl_s:g} seconds "
                "(the cap keeps a forgotten fault from outliving a game day; the proxy's "
                "--max-ttl-s sets it).",
                param="ttl_s",
            )
        raw = {k: v for k, v in body.items() if k not in ("kind", "ttl_s")}
        where = ""
        if "params" in raw:
            nested = raw["params"]
            if not isinstance(nested, dict):
                raise BadRequest(
                    f"'params' must be an object of the {kind!r} fault's parameters, "
                    f"got {type(nested).__name__}.",
                    param="params",
                )
            if len(raw) > 1:
                others = ", ".join(sorted(k for k in raw if k != "params"))
                raise BadRequest(
                    f"Give the {kind!r} fault's parameters either flat or under 'params', "
                    f"not both (flat: {others}).",
                    param="params",
                )
            raw, where = nested, "params."
        for name in RESERVED_FIELDS:
            if name in raw:
                raise BadRequest(
                    f"'{where}{name}' is not a parameter of the {kind!r} fault: give 'kind' "
                    "and 'ttl_s' once, at the top of the body.",
                    param=f"{where}{name}",
                )
        try:
            params = self.kinds[kind].model_validate(raw)
        except ValidationError as exc:
            raise from_validation_error(exc, what=f"{kind!r} fault") from None
        return kind, seconds, params

    # -- operations ---------------------------------------------------------------
    def inject(self, body: Mapping[str, Any], actor: str = "admin") -> tuple[Fault, list[Fault]]:
        """A new fault from an admin body, and the older faults of its kind it replaced (they
        stop acting at once and for good). 400 for a bad body, 429 when ``max_faults`` other
        faults are active."""
        kind, ttl, params = self._parse(body)
        self._prune()
        replaced = [f for f in self._faults.values() if f.kind == kind]
        others = len(self._faults) - len(replaced)
        if others >= self.max_faults:
            raise TooManyFaults(
                f"The fault proxy already holds {others} active faults, its cap "
                f"(--max-faults {self.max_faults}): clear one (DELETE /admin/faults/{{id}}), "
                "wait for one to expire, or start the proxy with a larger --max-faults.",
                code="too_many_faults",
            )
        for old in replaced:
            del self._faults[old.id]
        now = self._clock()
        seed = getattr(params, "seed", 0)
        fault = Fault(
            id=uuid.uuid4().hex[:12],
            kind=kind,
            params=params,
            ttl_s=ttl,
            injected_at=self._wall(),
            expires_mono=now + ttl,
            seq=next(self._seq),
            rng=random.Random(seed),
        )
        self._faults[fault.id] = fault
        for old in replaced:
            self._log.info("fault_replaced", fault_id=old.id, kind=kind, by=fault.id, actor=actor)
        self._log.info(
            "fault_injected",
            fault_id=fault.id,
            kind=kind,
            ttl_s=ttl,
            params=params.model_dump(),
            actor=actor,
        )
        return fault, replaced

    def _prune(self) -> None:
        if not self._faults:
            return
        now = self._clock()
        for fid, fault in list(self._faults.items()):
            if fault.expires_mono <= now:
                del self._faults[fid]
                self._log.info("fault_expired", fault_id=fid, kind=fault.kind, ttl_s=fault.ttl_s)

    def active(self) -> list[Fault]:
        """Active faults, oldest first (prunes and logs the expired ones)."""
        self._prune()
        return sorted(self._faults.values(), key=lambda f: f.seq)

    def any_active(self) -> bool:
        """Whether any fault is active (the hot path's one check when there is none)."""
        if not self._faults:
            return False
        self._prune()
        return bool(self._faults)

    def get(self, kind: str) -> Fault | None:
        """The active fault of ``kind`` (at most one), or None."""
        if not self._faults:
            return None
        self._prune()
        for fault in self._faults.values():
            if fault.kind == kind:
                return fault
        return None

    def is_active(self, fault: Fault) -> bool:
        """Whether ``fault`` still acts: not cleared, replaced nor expired."""
        self._prune()
        return self._faults.get(fault.id) is fault

    async def delay(self, fault: Fault, seconds: float) -> None:
        """Sleep ``seconds`` while ``fault`` stays active: clearing or replacing it, or its
        TTL running out, ends the sleep, so a delay never outlives its fault."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, DELAY_POLL_S))
            if not self.is_active(fault):
                return

    def clear(self, fault_id: str, actor: str = "admin") -> Fault:
        self._prune()
        fault = self._faults.pop(fault_id, None)
        if fault is None:
            raise NotFound(
                f"No active fault with id {fault_id!r} on the fault proxy (it may have "
                "expired or been replaced by a newer fault of its kind); GET /admin/faults "
                "lists the active ones.",
                param="id",
            )
        self._log.info("fault_cleared", fault_id=fault.id, kind=fault.kind, actor=actor)
        return fault

    def clear_all(self, actor: str = "admin") -> list[Fault]:
        cleared = self.active()
        self._faults.clear()
        for fault in cleared:
            self._log.info("fault_cleared", fault_id=fault.id, kind=fault.kind, actor=actor)
        return cleared

    def to_json(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [f.to_json(now) for f in self.active()]
