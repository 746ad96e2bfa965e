"""The broker's high-water mark: what it has acknowledged, kept outside SQLite, so a store
that comes back older than that (a truncated WAL, a database restored from an old copy, an
empty file) is noticed at start instead of served as if nothing happened.

``DIR/broker.highwater.json`` holds two parts:

- ``acknowledged``: the store's state after the last acknowledged write — each release's
  revision, each registered version (with its digest), each quarantined version and the
  last event's seq. It only grows, as the store does (nothing is ever deleted).
- ``carried``: what an operator's ``--accept-store-loss`` kept from writes the store lost
  for good: the revision each lost release had reached (a release created again under
  that name starts above it) and the versions quarantined before the loss (registered
  again, they come back quarantined). A loss is accepted, never forgotten.

The file is replaced whole (temp file, fsync, rename, fsync of the folder) after each
COMMIT and before the write is answered, so a 2xx is never newer than the mark.

This module must never touch SQLite or HTTP: it compares two summaries and keeps a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from canary_contract.json import JsonObject
from canarystack.common.error_fields import CanaryStackError

MARK_FILE = "broker.highwater.json"
FORMAT = 1


class MarkFileError(CanaryStackError):
    """The mark file exists but cannot be read as one (the message says what to do)."""


class SummaryJson(TypedDict):
    """What a store held when the broker acknowledged it (the mark file's
    ``acknowledged``)."""

    releases: dict[str, int]
    versions: dict[str, str]
    quarantined: list[str]
    events_seq: int


class CarriedJson(TypedDict):
    """What accepted losses left behind (the mark file's ``carried``)."""

    release_floors: dict[str, int]
    quarantined: dict[str, str]


class MarkJson(TypedDict):
    """The high-water mark file."""

    format: int
    acknowledged: SummaryJson
    carried: CarriedJson


class LostRevisions(TypedDict):
    store_revision: int
    acknowledged_revision: int


class LostEvents(TypedDict):
    store_seq: int
    acknowledged_seq: int


class LossJson(TypedDict):
    """What a store lost against the mark, as the API shows it."""

    releases: dict[str, LostRevisions]
    versions: list[str]
    quarantines: list[str]
    events: LostEvents | None
    lost: list[str]


@dataclass(frozen=True)
class Summary:
    """What a store holds, as far as losing it matters."""

    releases: dict[str, int] = field(default_factory=dict)  # name -> revision
    versions: dict[str, str] = field(default_factory=dict)  # version -> digest
    quarantined: frozenset[str] = frozenset()
    events_seq: int = 0

    def to_json(self) -> SummaryJson:
        return {
            "releases": dict(sorted(self.releases.items())),
            "versions": dict(sorted(self.versions.items())),
            "quarantined": sorted(self.quarantined),
            "events_seq": self.events_seq,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> Summary:
        return cls(
            releases={str(k): int(v) for k, v in data.get("releases", {}).items()},
            versions={str(k): str(v) for k, v in data.get("versions", {}).items()},
            quarantined=frozenset(str(v) for v in data.get("quarantined", [])),
            events_seq=int(data.get("events_seq", 0)),
        )


@dataclass(frozen=True)
class Carried:
    """What accepted losses left behind, applied to every later write."""

    release_floors: dict[str, int] = field(default_factory=dict)  # name -> lost revision
    quarantined: dict[str, str] = field(default_factory=dict)  # version -> digest

    def to_json(self) -> CarriedJson:
        return {
            "release_floors": dict(sorted(self.release_floors.items())),
            "quarantined": dict(sorted(self.quarantined.items())),
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> Carried:
        return cls(
            release_floors={str(k): int(v) for k, v in data.get("release_floors", {}).items()},
            quarantined={str(k): str(v) for k, v in data.get("quarantined", {}).items()},
        )


@dataclass(frozen=True)
class Mark:
    acknowledged: Summary = field(default_factory=Summary)
    carried: Carried = field(default_factory=Carried)

    def to_json(self) -> MarkJson:
        return {
            "format": FORMAT,
            "acknowledged": self.acknowledged.to_json(),
            "carried": self.carried.to_json(),
        }


@dataclass(frozen=True)
class Loss:
    """What the store lost against the mark, one line per fact, for people and the API."""

    releases: dict[str, tuple[int, int]]  # name -> (store revision, 0 if gone; mark revision)
    versions: list[str]  # registered, now missing
    quarantines: list[str]  # quarantined, now missing or not quarantined
    events: tuple[int, int] | None  # (store's last seq, mark's last seq)

    def __bool__(self) -> bool:
        return bool(self.releases or self.versions or self.quarantines or self.events)

    def lines(self) -> list[str]:
        out = []
        for name, (have, had) in sorted(self.releases.items()):
            if have == 0:
                out.append(f"release {name!r}: all of revisions 1..{had} (the release is gone)")
            else:
                out.append(f"release {name!r}: revisions {have + 1}..{had} (the store has {have})")
        out += [f"version {v!r}: its registration" for v in self.versions]
        out += [f"version {v!r}: its quarantine" for v in self.quarantines]
        if self.events is not None:
            have, had = self.events
            out.append(f"events: seq {have + 1}..{had}")
        return out

    def to_json(self) -> LossJson:
        return {
            "releases": {
                n: {"store_revision": have, "acknowledged_revision": had}
                for n, (have, had) in sorted(self.releases.items())
            },
            "versions": self.versions,
            "quarantines": self.quarantines,
            "events": None
            if self.events is None
            else {"store_seq": self.events[0], "acknowledged_seq": self.events[1]},
            "lost": self.lines(),
        }


def compare(mark: Summary, store: Summary) -> Loss:
    """What ``store`` lacks of what ``mark`` says was acknowledged (empty: nothing)."""
    releases = {
        name: (store.releases.get(name, 0), rev)
        for name, rev in mark.releases.items()
        if store.releases.get(name, 0) < rev
    }
    versions = sorted(v for v in mark.versions if v not in store.versions)
    quarantines = sorted(v for v in mark.quarantined if v not in store.quarantined)
    events = (store.events_seq, mark.events_seq) if store.events_seq < mark.events_seq else None
    return Loss(releases, versions, quarantines, events)


def grown(mark: Summary, store: Summary) -> Summary:
    """The mark after a write: never lower than it was, whatever the store says."""
    releases = dict(mark.releases)
    for name, rev in store.releases.items():
        releases[name] = max(rev, releases.get(name, 0))
    return Summary(
        releases=releases,
        versions={**mark.versions, **store.versions},
        quarantined=mark.quarantined | store.quarantined,
        events_seq=max(mark.events_seq, store.events_seq),
    )


def carry(mark: Mark, loss: Loss, store: Summary) -> Carried:
    """What accepting ``loss`` must keep: the revisions of releases the store no longer has,
    and the quarantines of versions it no longer has (the others are restored in the
    store itself)."""
    floors = dict(mark.carried.release_floors)
    for name, (have, had) in loss.releases.items():
        if have == 0:
            floors[name] = max(had, floors.get(name, 0))
    quarantined = dict(mark.carried.quarantined)
    for version in loss.quarantines:
        if version not in store.versions:
            quarantined[version] = mark.acknowledged.versions.get(version, "")
    return Carried(floors, quarantined)


def mark_path(state_dir: Path) -> Path:
    return Path(state_dir) / MARK_FILE


def read_mark(state_dir: Path) -> Mark | None:
    """The mark in ``state_dir``, or None when there is none (a new state folder)."""
    path = mark_path(state_dir)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} high-water mark")
        return Mark(
            Summary.from_json(data.get("acknowledged") or {}),
            Carried.from_json(data.get("carried") or {}),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise MarkFileError(
            f"--state-dir: the high-water mark {path} cannot be read ({exc}). It says which "
            "writes this broker acknowledged; without it a lost store would go unnoticed. "
            "Restore it from the same backup as broker.sqlite, or move it away to start "
            "trusting the store as it is."
        ) from None


def write_mark(state_dir: Path, mark: Mark) -> None:
    """Replace the mark file whole and durably (the rename, too, is fsync'ed)."""
    path = mark_path(state_dir)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(mark.to_json(), f, sort_keys=True, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
