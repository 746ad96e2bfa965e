"""The broker's durable state: one SQLite file (``DIR/broker.sqlite``) in WAL mode. Over 400
lines because every write (version, release, patch, quarantine, annotation) is one
transaction with the same compare-and-set and event append, read in one place; what a
PATCH leads to (pure) is ``changes``.

This module must never acknowledge a write before COMMIT, update or delete an event,
change a phase except through ``phases.check_transition``, or know anything of HTTP.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from canary_contract import strictjson
from canarystack.broker.changes import ReleasePatch as ReleasePatch  # tests import it here
from canarystack.broker.changes import diff, number, plan
from canarystack.broker.errors import Conflicting, Missing, Refused
from canarystack.broker.highwater import Summary
from canarystack.broker.phases import Phase
from canarystack.broker.records import CanaryJson, EventJson, ReleaseJson, VersionJson
from canarystack.common.error_fields import CanaryStackError

SCHEMA_VERSION = 1
DB_FILE = "broker.sqlite"

# ``versions`` (version, digest, manifest, quarantined, registered_at, and who quarantined
# it and why), ``releases`` (one row per release, with its revision) and ``events``
# (append-only: seq, release, time, revision, actor, change JSON, reason; triggers refuse
# UPDATE and DELETE).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    version TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    manifest TEXT NOT NULL,
    quarantined INTEGER NOT NULL DEFAULT 0,
    registered_at REAL NOT NULL,
    quarantined_at REAL,
    quarantined_by TEXT,
    quarantine_reason TEXT
);
CREATE TABLE IF NOT EXISTS releases (
    name TEXT PRIMARY KEY,
    phase TEXT NOT NULL,
    revision INTEGER NOT NULL,
    stable_version TEXT NOT NULL REFERENCES versions(version),
    canary_version TEXT REFERENCES versions(version),
    weight_canary REAL NOT NULL,
    trip TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    release TEXT NOT NULL,
    time REAL NOT NULL,
    revision INTEGER NOT NULL,
    actor TEXT NOT NULL,
    change TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_release ON events(release, seq);
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
"""

_RELEASE_SELECT = """
SELECT r.name, r.phase, r.revision, r.stable_version, sv.digest AS stable_digest,
       r.canary_version, cv.digest AS canary_digest, cv.quarantined AS canary_quarantined,
       r.weight_canary, r.trip, r.created_at, r.updated_at
FROM releases r
JOIN versions sv ON sv.version = r.stable_version
LEFT JOIN versions cv ON cv.version = r.canary_version
"""


class StateDirError(CanaryStackError):
    """The state folder or its database cannot be used (the message says why and what to do)."""


def _dumps_change(change: Mapping[str, object]) -> str:
    """An event's change as strict JSON: a non-finite number is refused, never stored."""
    return json.dumps(change, default=str, separators=(",", ":"), allow_nan=False)


class Store:
    """The broker database. Open with ``Store.open(state_dir)``; use from one thread.

    ``Store`` is synchronous and not thread-safe: the server calls it from one dedicated
    thread. It raises the domain errors of ``canarystack.broker.errors`` (``Missing``,
    ``Conflicting``, ``Refused``) for anything a client caused, and ``StateDirError`` when
    the state folder cannot be used; the HTTP layer maps the first to statuses,
    ``__main__`` turns the second into its message and exit status 1.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    # -- lifecycle ------------------------------------------------------------------
    @classmethod
    def open(cls, state_dir: Path) -> Store:
        """Open (or create) the database in ``state_dir``.

        ``journal_mode=WAL`` with ``synchronous=FULL``: a write is acknowledged (2xx) only
        after its COMMIT returned, and with FULL the commit has fsync'ed the WAL, so an
        acknowledged write survives SIGKILL of the broker *and* a power loss or kernel
        crash. (``NORMAL`` would also survive SIGKILL, since the committed WAL frames are in
        the OS page cache and SQLite replays them on the next open, but can lose the last
        commits on power loss, which would break the promise a 2xx makes to the gate and
        the rollback executor.) The price is one fsync per write; the broker sees a few
        writes per second at most.
        """
        path = Path(state_dir) / DB_FILE
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
            # check_same_thread=False: the server opens it in its DB thread, tests in theirs;
            # the class is still used from one thread at a time.
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.Error as exc:
            raise StateDirError(
                f"--state-dir: cannot open {path} ({exc}). Check that the folder exists, is "
                "writable, and that the file is a broker database (or move it away)."
            ) from None
        if str(mode).lower() != "wal":
            conn.close()
            raise StateDirError(
                f"--state-dir: {path} could not be switched to WAL mode (got {mode!r}); "
                "use a local filesystem for the state folder."
            )
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        found = conn.execute("PRAGMA user_version").fetchone()[0]
        if found > SCHEMA_VERSION:
            conn.close()
            raise StateDirError(
                f"--state-dir: {path} has schema version {found}, newer than this broker's "
                f"{SCHEMA_VERSION}; run a newer broker or use another state folder."
            )
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        return cls(conn, path)

    def close(self) -> None:
        self._conn.close()

    def pragma(self, name: str) -> Any:
        return self._conn.execute(f"PRAGMA {name}").fetchone()[0]

    def summary(self) -> Summary:
        """What the store holds, for the high-water mark (``highwater``)."""
        db = self._conn
        versions = {r["version"]: r["digest"] for r in db.execute("SELECT * FROM versions")}
        quarantined = frozenset(
            r["version"] for r in db.execute("SELECT version FROM versions WHERE quarantined")
        )
        releases = {r["name"]: r["revision"] for r in db.execute("SELECT * FROM releases")}
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
        return Summary(releases, versions, quarantined, int(seq))

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write: every write is one ``BEGIN IMMEDIATE`` transaction that reads the
        release's revision, compares it with what the caller expected (compare-and-set),
        checks the phase rules (``canarystack.broker.phases``), writes ``revision + 1``
        guarded by ``WHERE revision = <read>`` and appends an event describing the change
        (old -> new)."""
        # IMMEDIATE takes the write lock at BEGIN, so the revision we read cannot change
        # before our UPDATE; the guarded UPDATE below is the belt to these braces.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # -- versions ---------------------------------------------------------------------
    @staticmethod
    def _version_json(row: sqlite3.Row) -> VersionJson:
        out: VersionJson = {
            "version": row["version"],
            "digest": row["digest"],
            "manifest": json.loads(row["manifest"]),
            "quarantined": bool(row["quarantined"]),
            "registered_at": row["registered_at"],
        }
        if row["quarantined"]:
            out["quarantine"] = {
                "time": row["quarantined_at"],
                "actor": row["quarantined_by"],
                "reason": row["quarantine_reason"],
            }
        return out

    def get_version(self, version: str) -> VersionJson | None:
        row = self._conn.execute("SELECT * FROM versions WHERE version = ?", (version,)).fetchone()
        return None if row is None else self._version_json(row)

    def list_versions(self) -> list[VersionJson]:
        rows = self._conn.execute("SELECT * FROM versions ORDER BY registered_at, version")
        return [self._version_json(r) for r in rows]

    def register_version(
        self, version: str, digest: str, manifest: Any, now: float
    ) -> tuple[VersionJson, bool]:
        """Insert a version; ``(version, False)`` for an identical re-registration.

        The caller has already checked that ``digest`` matches ``manifest``.
        """
        with self._tx() as db:
            row = db.execute("SELECT * FROM versions WHERE version = ?", (version,)).fetchone()
            if row is not None:
                if row["digest"] != digest:
                    raise Conflicting(
                        f"Version {version!r} is already registered with digest "
                        f"{row['digest']}, not {digest}: versions are immutable; register "
                        "the new artifact under a new version name.",
                        param="version",
                        code="version_conflict",
                    )
                return self._version_json(row), False
            db.execute(
                "INSERT INTO versions (version, digest, manifest, registered_at) "
                "VALUES (?, ?, ?, ?)",
                (version, digest, strictjson.dumps(manifest), now),
            )
            row = db.execute("SELECT * FROM versions WHERE version = ?", (version,)).fetchone()
            return self._version_json(row), True

    def quarantine_version(
        self, version: str, actor: str, reason: str, now: float
    ) -> tuple[VersionJson, list[ReleaseJson]]:
        """Mark a version quarantined (idempotent).

        Returns the version and the releases whose canary it is: their JSON shows
        ``canary.quarantined``, so each gets a new revision and an event.
        """
        with self._tx() as db:
            row = db.execute("SELECT * FROM versions WHERE version = ?", (version,)).fetchone()
            if row is None:
                raise Missing(
                    f"No version {version!r}: GET /v1/versions lists the registered ones.",
                    param="version",
                )
            if row["quarantined"]:
                return self._version_json(row), []
            names = [
                r["name"]
                for r in db.execute(
                    "SELECT name FROM releases WHERE canary_version = ? ORDER BY name", (version,)
                )
            ]
            before = {n: self._release_in_tx(db, n) for n in names}
            db.execute(
                "UPDATE versions SET quarantined = 1, quarantined_at = ?, quarantined_by = ?, "
                "quarantine_reason = ? WHERE version = ?",
                (now, actor, reason, version),
            )
            changed = []
            for name in names:
                old = before[name]
                assert old is not None
                self._bump(db, name, old["revision"], now)
                new = self._release_in_tx(db, name)
                assert new is not None
                self._append(db, name, now, new["revision"], actor, diff(old, new), reason)
                changed.append(new)
            row = db.execute("SELECT * FROM versions WHERE version = ?", (version,)).fetchone()
            return self._version_json(row), changed

    # -- releases ---------------------------------------------------------------------
    @staticmethod
    def _release_json(row: sqlite3.Row) -> ReleaseJson:
        canary: CanaryJson | None = None
        if row["canary_version"] is not None:
            canary = {
                "version": row["canary_version"],
                "digest": row["canary_digest"],
                "quarantined": bool(row["canary_quarantined"]),
            }
        return {
            "name": row["name"],
            "phase": row["phase"],
            "revision": row["revision"],
            "stable": {"version": row["stable_version"], "digest": row["stable_digest"]},
            "canary": canary,
            "weights": {"canary": number(row["weight_canary"])},
            # Stored as ``trip_json`` wrote it from the PATCH's validated ``TripEvidence``.
            "trip": None if row["trip"] is None else json.loads(row["trip"]),
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        }

    def _release_in_tx(self, db: sqlite3.Connection, name: str) -> ReleaseJson | None:
        row = db.execute(_RELEASE_SELECT + " WHERE r.name = ?", (name,)).fetchone()
        return None if row is None else self._release_json(row)

    def get_release(self, name: str) -> ReleaseJson | None:
        return self._release_in_tx(self._conn, name)

    def list_releases(self) -> list[ReleaseJson]:
        rows = self._conn.execute(_RELEASE_SELECT + " ORDER BY r.name")
        return [self._release_json(r) for r in rows]

    def _usable_version(
        self, db: sqlite3.Connection, version: str, param: str, *, as_canary: bool
    ) -> None:
        row = db.execute(
            "SELECT quarantined FROM versions WHERE version = ?", (version,)
        ).fetchone()
        if row is None:
            raise Refused(
                f"Unknown version {version!r} in '{param}': register it first with "
                "POST /v1/versions (GET /v1/versions lists the registered ones).",
                param=param,
                code="unknown_version",
            )
        if as_canary and row["quarantined"]:
            raise Refused(
                f"Version {version!r} in '{param}' is quarantined and cannot be a canary; "
                "register a fixed artifact under a new version name.",
                param=param,
                code="version_quarantined",
            )

    def create_release(
        self,
        name: str,
        stable: str,
        canary: str | None,
        canary_weight: float,
        actor: str,
        reason: str,
        now: float,
        first_revision: int = 1,
    ) -> ReleaseJson:
        """A new release at ``first_revision`` (above 1 only for a name whose earlier
        release a store loss took: its revisions are never reused)."""
        with self._tx() as db:
            if self._release_in_tx(db, name) is not None:
                raise Conflicting(
                    f"Release {name!r} already exists: change it with PATCH "
                    f"/v1/releases/{name} (GET it for the current revision).",
                    param="name",
                    code="release_exists",
                )
            self._usable_version(db, stable, "stable", as_canary=False)
            if canary is not None:
                self._usable_version(db, canary, "canary", as_canary=True)
            elif canary_weight > 0:
                raise Refused(
                    f"weights.canary is {canary_weight:g} but the release has no canary: "
                    "give 'canary' or a weight of 0.",
                    param="weights.canary",
                    code="no_canary",
                )
            db.execute(
                "INSERT INTO releases (name, phase, revision, stable_version, canary_version, "
                "weight_canary, trip, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (
                    name,
                    Phase.PROGRESSING.value,
                    first_revision,
                    stable,
                    canary,
                    canary_weight,
                    now,
                    now,
                ),
            )
            release = self._release_in_tx(db, name)
            assert release is not None
            self._append(db, name, now, first_revision, actor, diff(None, release), reason)
            return release

    def patch_release(
        self,
        name: str,
        patch: ReleasePatch,
        actor: str,
        reason: str,
        now: float,
        authorize: Callable[[Phase, Phase], None] | None = None,
    ) -> tuple[ReleaseJson, bool]:
        """Apply a PATCH with compare-and-set; ``(release, changed)``.

        A PATCH whose values equal the current ones changes nothing: no new revision and
        no event (so a retried step of the rollback executor is harmless). ``authorize``
        (the caller's capability check, ``(phase before, phase after)``) runs inside the
        transaction, so the phase it judges is the one the change starts from.
        """
        with self._tx() as db:
            old = self._release_in_tx(db, name)
            if old is None:
                raise Missing(f"No release {name!r}: GET /v1/releases lists them.", param="name")
            if old["revision"] != patch.expected_revision:
                raise Conflicting(
                    f"Revision conflict on release {name!r}: expected_revision is "
                    f"{patch.expected_revision} but the release is at revision "
                    f"{old['revision']}; GET it again and reapply your change.",
                    param="expected_revision",
                    code="revision_conflict",
                    extra={"current_revision": old["revision"]},
                )
            if authorize is not None:
                current = Phase(old["phase"])
                authorize(current, patch.phase or current)
            new = plan(
                old,
                patch,
                check_canary=lambda v: self._usable_version(db, v, "canary", as_canary=True),
                canary_ref=lambda v: self._canary_ref(db, v),
            )
            change = diff(old, new)
            if not change:
                return old, False
            revision = self._bump(db, name, old["revision"], now, new)
            release = self._release_in_tx(db, name)
            assert release is not None and release["revision"] == revision
            self._append(db, name, now, revision, actor, change, reason)
            return release, True

    def skip_past_loss(
        self,
        name: str,
        lost_revision: int,
        change: Mapping[str, object],
        actor: str,
        reason: str,
        now: float,
    ) -> ReleaseJson:
        """After an accepted store loss: move the release to ``lost_revision + 1`` with its
        canary at 0 % (a revision a router applied before the loss must never look newer
        than what the store serves now, and what the canary got was lost too), and record
        ``change`` with the move in an event."""
        with self._tx() as db:
            old = self._release_in_tx(db, name)
            if old is None:
                raise Missing(f"No release {name!r}: GET /v1/releases lists them.", param="name")
            revision = max(lost_revision, old["revision"]) + 1
            db.execute(
                "UPDATE releases SET revision = ?, weight_canary = 0, updated_at = ? "
                "WHERE name = ? AND revision = ?",
                (revision, now, name, old["revision"]),
            )
            new = self._release_in_tx(db, name)
            assert new is not None
            recorded: dict[str, object] = {
                **change,
                **diff(old, new),
                "revision": {"old": old["revision"], "new": revision},
            }
            self._append(db, name, now, revision, actor, recorded, reason)
            return new

    def _canary_ref(self, db: sqlite3.Connection, version: str) -> CanaryJson:
        row = db.execute(
            "SELECT digest, quarantined FROM versions WHERE version = ?", (version,)
        ).fetchone()
        return {
            "version": version,
            "digest": row["digest"],
            "quarantined": bool(row["quarantined"]),
        }

    def _bump(
        self,
        db: sqlite3.Connection,
        name: str,
        expected: int,
        now: float,
        new: ReleaseJson | None = None,
    ) -> int:
        """Write revision+1 (and ``new``'s fields) guarded by the revision read."""
        if new is None:
            cur = db.execute(
                "UPDATE releases SET revision = revision + 1, updated_at = ? "
                "WHERE name = ? AND revision = ?",
                (now, name, expected),
            )
        else:
            cur = db.execute(
                "UPDATE releases SET revision = revision + 1, updated_at = ?, phase = ?, "
                "stable_version = ?, canary_version = ?, weight_canary = ?, trip = ? "
                "WHERE name = ? AND revision = ?",
                (
                    now,
                    new["phase"],
                    new["stable"]["version"],
                    new["canary"]["version"] if new["canary"] else None,
                    float(new["weights"]["canary"]),
                    None if new["trip"] is None else strictjson.dumps(new["trip"]),
                    name,
                    expected,
                ),
            )
        if cur.rowcount != 1:  # cannot happen under BEGIN IMMEDIATE; refuse loudly if it does
            raise RuntimeError(f"compare-and-set lost on release {name!r} at {expected}")
        return expected + 1

    # -- events -----------------------------------------------------------------------
    @staticmethod
    def _event_json(row: sqlite3.Row) -> EventJson:
        return {
            "seq": row["seq"],
            "release": row["release"],
            "time": row["time"],
            "revision": row["revision"],
            "actor": row["actor"],
            "change": json.loads(row["change"]),
            "reason": row["reason"],
        }

    def _append(
        self,
        db: sqlite3.Connection,
        release: str,
        now: float,
        revision: int,
        actor: str,
        change: Mapping[str, object],
        reason: str,
    ) -> EventJson:
        cur = db.execute(
            "INSERT INTO events (release, time, revision, actor, change, reason) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (release, now, revision, actor, _dumps_change(change), reason),
        )
        row = db.execute("SELECT * FROM events WHERE seq = ?", (cur.lastrowid,)).fetchone()
        return self._event_json(row)

    def annotate(
        self, name: str, change: Mapping[str, object], actor: str, reason: str, now: float
    ) -> EventJson:
        """Append an annotation event; the release's revision does not change."""
        with self._tx() as db:
            release = self._release_in_tx(db, name)
            if release is None:
                raise Missing(f"No release {name!r}: GET /v1/releases lists them.", param="name")
            return self._append(db, name, now, release["revision"], actor, change, reason)

    def events(self, name: str, after_seq: int = 0, limit: int = 10_000) -> list[EventJson]:
        if self.get_release(name) is None:
            raise Missing(f"No release {name!r}: GET /v1/releases lists them.", param="name")
        rows = self._conn.execute(
            "SELECT * FROM events WHERE release = ? AND seq > ? ORDER BY seq LIMIT ?",
            (name, after_seq, limit),
        )
        return [self._event_json(r) for r in rows]
