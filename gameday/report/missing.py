"""``Missing``: one piece of a run folder the report could not read, and what follows.

Must never lose the verdict's side of it: ``required`` says whether the experiment's
verdict fails because of it (fail-closed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from canary_contract.json import record_json


class MissingJson(TypedDict):
    """A ``Missing`` in summary.json (``required`` as ``fails_verdict``)."""

    experiment: str | None
    piece: str
    problem: str
    effect: str
    fails_verdict: bool


@dataclass(frozen=True)
class Missing:
    """One thing the report could not read, and what follows from it."""

    experiment: str | None  # None: the run as a whole
    piece: str
    problem: str
    effect: str
    required: bool  # True: the experiment's verdict fails because of it (fail-closed)

    def to_json(self) -> MissingJson:
        return record_json(self, MissingJson, fails_verdict=self.required)

    def sentence(self) -> str:
        where = f"{self.experiment}/{self.piece}" if self.experiment else self.piece
        return f"{where}: {self.problem} — {self.effect}"


def short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
