"""Faults with a time-to-live, enforced by the component that holds them (served at
``/admin/faults`` by ``canarystack.common.app``).

Two bounds keep a fault admin API from being a way to harm the component: a newer fault of
a kind replaces the older one of that kind for good (so the older can never come back into
force when the newer expires), and at most ``max_faults`` faults are active at once (429
beyond).

This module must never sleep, do I/O, or hold a fault past its TTL.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from canarystack.common.errors import BadRequest, NotFound, TooManyFaults, from_validation_error
from canarystack.common.logs import JsonLogger, get_logger

DEFAULT_MAX_TTL_S = 600.0
# Most faults active at once in one component. Since a newer fault of a kind replaces the
# older one, a component holds at most one per kind (no component has more than 5 kinds);
# 16 leaves room for kinds to come and still bounds what a flood of POSTs can hold (the
# fault proxy's --max-faults default is the same).
DEFAULT_MAX_FAULTS = 16
# The fault admin API's body limit: a fault body is a handful of fields.
FAULT_BODY_LIMIT = 16 * 1024
# Names a fault's parameters may not use: they belong to the fault itself.
RESERVED_FIELDS = ("kind", "ttl_s", "params")


def check_max_ttl_s(value: object, what: str = "max_ttl_s") -> float:
    """``value`` as a cap on fault TTLs: a finite number of seconds > 0, else ValueError
    naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{what} is {value!r}: it must be a finite number of seconds > 0 "
            f"(default {DEFAULT_MAX_TTL_S:g}); an infinite cap would let a fault outlive "
            "every game day"
        )
    return seconds


# How often a fault delay checks whether its fault is still active.
DELAY_POLL_S = 0.05


class FaultParams(BaseModel):
    """Base for a fault kind's parameters: unknown fields are refused (typos show)."""

    model_config = ConfigDict(extra="forbid")


class NoParams(FaultParams):
    pass


class LatencyMs(FaultParams):
    """A ``latency`` fault that adds ``ms`` milliseconds (default 100) to each request or
    step; the component decides where it sleeps."""

    ms: Annotated[float, Field(ge=0, le=60_000)] = 100.0


class FaultJson(TypedDict):
    """A fault as ``/admin/faults`` lists it (``params``: its kind's own settings)."""

    id: str
    kind: str
    params: dict[str, object]
    ttl_s: float
    injected_at: float
    expires_at: float
    remaining_s: float
    # In the answer to an injection only: the faults of its kind it replaced.
    replaced: NotRequired[list[str]]


@dataclass
class Fault:
    id: str
    kind: str
    params: FaultParams
    ttl_s: float
    injected_at: float  # wall clock, for people
    expires_mono: float  # monotonic, for enforcement
    seq: int = field(default=0)
    # The ids of the older faults of its kind this one replaced (cleared for good).
    replaced: tuple[str, ...] = ()

    def remaining_s(self, now_mono: float) -> float:
        return max(0.0, self.expires_mono - now_mono)

    def to_json(self, now_mono: float) -> FaultJson:
        remaining = self.remaining_s(now_mono)
        return {
            "id": self.id,
            "kind": self.kind,
            "params": self.params.model_dump(),
            "ttl_s": self.ttl_s,
            "injected_at": self.injected_at,
            "expires_at": self.injected_at + self.ttl_s,
            "remaining_s": round(remaining, 3),
        }


class FaultRegistry:
    """The faults active in one process, behind every component's admin API:
    ``GET /admin/faults`` -> ``{"faults": [fault, ...]}`` (with ``remaining_s``),
    ``POST`` ``{"kind": K, "ttl_s": S, ...params}`` -> 201 ``{"id": ..., "replaced": [id]}``
    (429 when ``max_faults`` faults of other kinds are active),
    ``DELETE /admin/faults/{id}`` -> ``{"cleared": [fault]}`` (404 if unknown or expired),
    ``DELETE /admin/faults`` -> ``{"cleared": [fault, ...]}``.

    The TTL is a dead-man switch: expiry is decided by this process's monotonic clock on
    every lookup, so a fault stops acting when its time is up even if the harness that
    injected it has died. ``ttl_s`` is required, finite and capped (``max_ttl_s``, itself
    finite and > 0: an infinite cap would make a fault permanent). Faults live in memory
    only: a restarted process comes back clean.

    A newer fault of a kind replaces the active one of that kind: the older is cleared at
    once (logged ``fault_replaced``) and never comes back, whatever happens to the newer.
    At most ``max_faults`` (default ``DEFAULT_MAX_FAULTS``) are active at once.

    ``kinds`` maps a kind name to its parameter model (a ``FaultParams`` subclass).
    ``clock`` is monotonic time and ``wall`` epoch time; both are parameters so tests
    can move time instead of sleeping.
    """

    def __init__(
        self,
        component: str,
        kinds: Mapping[str, type[FaultParams]],
        *,
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
        max_faults: int = DEFAULT_MAX_FAULTS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        log: JsonLogger | None = None,
    ) -> None:
        self.component = component
        self.kinds = dict(kinds)
        for kind, model in self.kinds.items():
            clash = sorted(set(model.model_fields) & set(RESERVED_FIELDS))
            if clash:
                raise ValueError(
                    f"fault kind {kind!r} of {component}: its parameters may not be named "
                    f"{', '.join(clash)} (those belong to the fault itself)"
                )
        self.max_ttl_s = check_max_ttl_s(max_ttl_s)
        if isinstance(max_faults, bool) or not isinstance(max_faults, int) or max_faults < 1:
            raise ValueError(
                f"max_faults of {component} is {max_faults!r}: give a whole number >= 1 "
                f"(default {DEFAULT_MAX_FAULTS})"
            )
        self.max_faults = max_faults
        self._clock = clock
        self._wall = wall
        self._log = log or get_logger(component)
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
                f"Unknown fault kind {kind!r} for {self.component}: use one of {allowed}.",
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
        if not math.isfinite(seconds):
            raise BadRequest(
                f"'ttl_s' is {ttl!r}: it must be a finite number of seconds > 0 and "
                f"<= {self.max_ttl_s:g}.",
                param="ttl_s",
            )
        if not (0 < seconds <= self.max_ttl_s):
            raise BadRequest(
                f"'ttl_s' is {ttl!r}: it must be > 0 and <= {self.max_ttl_s:g} seconds "
                "(the cap keeps a forgotten fault from outliving a game day).",
                param="ttl_s",
            )
        raw = {k: v for k, v in body.items() if k not in ("kind", "ttl_s")}
        where = ""
        # Accept params either flat or under "params" (an object, alone).
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
                    f"'{where}{name}' is not a parameter of the {kind!r} fault: a fault's "
                    f"parameters cannot set its {name}; give 'kind' and 'ttl_s' once, at "
                    "the top of the body.",
                    param=f"{where}{name}",
                )
        try:
            params = self.kinds[kind].model_validate(raw)
        except ValidationError as exc:
            raise from_validation_error(exc, what=f"{kind!r} fault") from None
        return kind, seconds, params

    # -- operations ---------------------------------------------------------------
    def inject(self, body: Mapping[str, Any], actor: str = "admin") -> Fault:
        """A new fault from an admin body; the active fault of its kind, if any, is replaced
        for good (its id is in the new fault's ``replaced``). Its parameters can never set
        its ``kind`` or ``ttl_s``: a body whose ``params`` names either is refused (400
        naming the field); the admin route also refuses a body that repeats a key, and a
        kind whose parameter model declares one of those names is a programming error at
        start. 429 when ``max_faults`` faults of other kinds are active."""
        kind, ttl, params = self._parse(body)
        self._prune()
        replaced = sorted((f for f in self._faults.values() if f.kind == kind), key=lambda f: f.seq)
        others = len(self._faults) - len(replaced)
        if others >= self.max_faults:
            raise TooManyFaults(
                f"{self.component} already holds {others} active faults, its cap "
                f"({self.max_faults}): clear one (DELETE /admin/faults/{{id}}, or DELETE "
                "/admin/faults for all), wait for one to expire, or replace one by injecting "
                "a fault of a kind already active."
            )
        for old in replaced:
            del self._faults[old.id]
        now = self._clock()
        fault = Fault(
            id=uuid.uuid4().hex[:12],
            kind=kind,
            params=params,
            ttl_s=ttl,
            injected_at=self._wall(),
            expires_mono=now + ttl,
            seq=next(self._seq),
            replaced=tuple(old.id for old in replaced),
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
        return fault

    def _prune(self) -> None:
        if not self._faults:
            return
        now = self._clock()
        for fid, fault in list(self._faults.items()):
            if fault.expires_mono <= now:
                del self._faults[fid]
                self._log.info("fault_expired", fault_id=fid, kind=fault.kind, ttl_s=fault.ttl_s)

    def active(self, kind: str | None = None) -> list[Fault]:
        """Active faults (oldest first), optionally of one kind."""
        self._prune()
        faults = sorted(self._faults.values(), key=lambda f: f.seq)
        if kind is not None:
            faults = [f for f in faults if f.kind == kind]
        return faults

    def get(self, kind: str) -> FaultParams | None:
        """The parameters of the active fault of ``kind``, or None (hot path)."""
        if not self._faults:
            return None
        found = self.active(kind)
        return found[-1].params if found else None

    async def delay(self, kind: str, seconds: float) -> None:
        """Sleep ``seconds`` while a fault of ``kind`` stays active: clearing it, or its
        TTL running out, ends the sleep, so a latency fault never outlives its TTL even
        in the middle of a request."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, DELAY_POLL_S))
            if self.get(kind) is None:
                return

    def clear(self, fault_id: str, actor: str = "admin") -> Fault:
        self._prune()
        fault = self._faults.pop(fault_id, None)
        if fault is None:
            raise NotFound(
                f"No active fault with id {fault_id!r} on {self.component} "
                "(it may have expired); GET /admin/faults lists the active ones.",
                param="id",
            )
        self._log.info("fault_cleared", fault_id=fault.id, kind=fault.kind, actor=actor)
        return fault

    def clear_all(self, actor: str = "admin") -> list[Fault]:
        self._prune()
        cleared = sorted(self._faults.values(), key=lambda f: f.seq)
        self._faults.clear()
        for fault in cleared:
            self._log.info("fault_cleared", fault_id=fault.id, kind=fault.kind, actor=actor)
        return cleared

    def count(self, kind: str) -> int:
        return len(self.active(kind))

    def to_json(self) -> list[FaultJson]:
        now = self._clock()
        return [f.to_json(now) for f in self.active()]
