"""The SLO result every checking probe returns and both verdicts read (docs/ARCHITECTURE.md
§7.1): ``{"check", "measured", "allowed", "unit", "ok", "detail"}``.

``detail.status`` is ``measured`` (a figure), ``failed`` (no figure: ``detail.why`` says
why) or ``not_measured`` (before the method, nothing to measure yet: not a check, ``ok``).
"""

from __future__ import annotations

import enum
from typing import Self

from pydantic import model_validator

from canary_contract._record import Flag, Number, Record, Text
from canary_contract.json import JsonObject, JsonValue


class SloStatus(enum.StrEnum):
    MEASURED = "measured"
    FAILED = "failed"
    NOT_MEASURED = "not_measured"


class SloResult(Record):
    check: Text
    measured: Number | None
    allowed: Number
    unit: Text
    ok: Flag
    detail: JsonObject

    @model_validator(mode="after")
    def _status_fits(self) -> SloResult:
        status = self.detail.get("status")
        if status not in set(SloStatus):
            raise ValueError(f"detail.status is {status!r}: give one of {', '.join(SloStatus)}")
        if (status == SloStatus.MEASURED) != (self.measured is not None):
            raise ValueError(
                f"detail.status is {status!r} but measured is {self.measured!r}: a figure "
                "is 'measured', no figure is 'failed' or 'not_measured'"
            )
        if status == SloStatus.NOT_MEASURED and not self.ok:
            raise ValueError("detail.status is 'not_measured' but ok is false: it is no check")
        return self

    @property
    def status(self) -> SloStatus:
        return SloStatus(self.detail["status"])

    @property
    def why(self) -> str | None:
        why = self.detail.get("why")
        return why if isinstance(why, str) else None

    @classmethod
    def of(
        cls,
        check: str,
        measured: float | None,
        allowed: float,
        unit: str,
        ok: bool,
        **detail: JsonValue,
    ) -> Self:
        """A measured result; without a figure (``measured`` None) a failed one."""
        status = SloStatus.MEASURED if measured is not None else SloStatus.FAILED
        return cls(
            check=check,
            measured=None if measured is None else round(float(measured), 6),
            allowed=float(allowed),
            unit=unit,
            ok=bool(ok),
            detail={"status": status.value, **detail},
        )

    @classmethod
    def failed(cls, check: str, allowed: float, unit: str, why: str, **detail: JsonValue) -> Self:
        """No figure, and why not."""
        return cls.of(check, None, allowed, unit, False, why=why, **detail)

    @classmethod
    def not_measured(cls, check: str, allowed: float, unit: str, why: str) -> Self:
        """Nothing to measure yet (before the method): not a check, so ``ok``."""
        return cls(
            check=check,
            measured=None,
            allowed=float(allowed),
            unit=unit,
            ok=True,
            detail={"status": SloStatus.NOT_MEASURED.value, "why": why},
        )
