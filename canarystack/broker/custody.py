"""The store under custody of its high-water mark: checked against it at start, the mark
grown after each acknowledged write, and a loss accepted only by an explicit operator
call that restores what it can (quarantines, revisions that never go back).

Everything here runs on the broker's database thread (``service.Broker`` calls it there).
This module must never acknowledge a write the mark does not cover, forget an accepted
loss's quarantines, or let a release's revision go back to a number it had before.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from canarystack.broker import highwater
from canarystack.broker.highwater import Loss, Mark
from canarystack.broker.records import ReleaseJson, VersionJson
from canarystack.broker.store import StateDirError, Store
from canarystack.common.logs import get_logger

# Who the broker's own writes during a recovery are recorded as.
ACTOR = "broker"

_log = get_logger("broker")


def recovery_text(state_dir: Path) -> str:
    """What an operator can do about a loss, in words (the 503s and the log say it)."""
    return (
        f"Stop the broker and put back broker.sqlite from a backup at least as new as the "
        f"loss (then start it again), or accept the loss: POST /v1/store/accept-loss with "
        f'the operator credential and a body {{"actor": ..., "reason": ...}} (the '
        f"quarantines are kept, each release comes back at a new revision with its canary "
        f"at 0 %). The mark is {highwater.mark_path(state_dir)}."
    )


class Custody:
    """The mark and the store together; use from the database thread only."""

    def __init__(self, store: Store, state_dir: Path) -> None:
        self.store = store
        self.state_dir = Path(state_dir)
        self.mark = Mark()
        self.lost: Loss | None = None
        # Why the last mark could not be saved (health says so), or None.
        self.unsaved: str | None = None

    # -- start ----------------------------------------------------------------------------
    def check(self) -> Loss | None:
        """Compare the store with the mark; the loss, or None (then the mark is grown to
        the store and the carried quarantines re-applied)."""
        try:
            found = highwater.read_mark(self.state_dir)
        except highwater.MarkFileError as exc:
            raise StateDirError(str(exc)) from None
        summary = self.store.summary()
        if found is None:  # a new state folder (or a broker from before the mark)
            self._save(Mark(summary))
            return None
        self.mark = found
        loss = highwater.compare(found.acknowledged, summary)
        if loss:
            self.lost = loss
            return loss
        self._reapply_quarantines(time.time())
        self.after_write()
        return None

    # -- writes ---------------------------------------------------------------------------
    def after_write(self) -> None:
        """Grow the mark to the store after a COMMIT, before the write is answered."""
        grown = highwater.grown(self.mark.acknowledged, self.store.summary())
        self._save(Mark(grown, self.mark.carried))

    def _save(self, mark: Mark) -> None:
        try:
            highwater.write_mark(self.state_dir, mark)
        except OSError as exc:
            self.unsaved = f"{highwater.mark_path(self.state_dir)}: {exc.strerror or exc}"
            _log.error("highwater_unsaved", error=self.unsaved)
            return
        self.mark = mark
        self.unsaved = None

    def first_revision(self, name: str) -> int:
        """The revision a new release of ``name`` starts at: above any it had before a loss."""
        return self.mark.carried.release_floors.get(name, 0) + 1

    def register_version(
        self, version: str, digest: str, manifest: Any, now: float
    ) -> tuple[VersionJson, bool]:
        """Register; a version quarantined before an accepted loss comes back quarantined."""
        registered, created = self.store.register_version(version, digest, manifest, now)
        if created and version in self.mark.carried.quarantined:
            registered, _ = self.store.quarantine_version(
                version, ACTOR, _carried_reason(version), now
            )
        return registered, created

    def _reapply_quarantines(self, now: float) -> list[ReleaseJson]:
        """Quarantine again every carried version the store has unquarantined (a broker
        killed between a registration and its quarantine)."""
        changed: list[ReleaseJson] = []
        for version in sorted(self.mark.carried.quarantined):
            found = self.store.get_version(version)
            if found is not None and not found["quarantined"]:
                _, releases = self.store.quarantine_version(
                    version, ACTOR, _carried_reason(version), now
                )
                changed += releases
        return changed

    # -- accepting a loss -----------------------------------------------------------------
    def accept(self, actor: str, reason: str, now: float) -> tuple[Loss, list[ReleaseJson]]:
        """The operator accepts ``self.lost``: restore what the store can still hold, carry
        the rest in the mark, and serve again. Returns the loss and the changed releases."""
        loss = self.lost
        assert loss is not None
        summary = self.store.summary()
        changed: list[ReleaseJson] = []
        note: dict[str, object] = {
            "annotation": "store_loss_accepted",
            "lost": loss.lines(),
            "accepted_by": actor,
        }
        for name, (have, had) in sorted(loss.releases.items()):
            if have > 0:
                changed.append(self.store.skip_past_loss(name, had, note, actor, reason, now))
        for version in loss.quarantines:
            if version in summary.versions:
                _, releases = self.store.quarantine_version(
                    version, ACTOR, f"quarantined before a store loss ({actor}: {reason})", now
                )
                changed += releases
        carried = highwater.carry(self.mark, loss, summary)
        self.mark = Mark(self.store.summary(), carried)
        changed += self._reapply_quarantines(now)
        self._save(Mark(self.store.summary(), carried))
        self.lost = None
        return loss, changed


def _carried_reason(version: str) -> str:
    return (
        f"version {version!r} was quarantined before a store loss an operator accepted; "
        "a quarantine is never lost with the store"
    )
