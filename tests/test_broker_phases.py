"""The phase rule book (pure) and the SQLite store (in-process, no HTTP)."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from canarystack.broker import manifest_digest, phases
from canarystack.broker.errors import BrokerDomainError, Conflicting, Missing, Refused
from canarystack.broker.phases import Phase
from canarystack.broker.store import ReleasePatch, Store
from canarystack.common.errors import ApiError
from tests.broker_support import digest_of, trip_record

# The table as docs/ARCHITECTURE.md §2 writes it; phases.py must say exactly this.
CONTRACT_EDGES = {
    ("progressing", "tripped"),
    ("progressing", "rolling_back"),
    ("progressing", "promoted"),
    ("tripped", "rolling_back"),
    ("rolling_back", "rolled_back"),
    ("rolled_back", "progressing"),
    ("promoted", "progressing"),
}


def test_transition_table_is_the_contract() -> None:
    edges = {(a.value, b.value) for a, targets in phases.TRANSITIONS.items() for b in targets}
    assert edges == CONTRACT_EDGES
    assert set(phases.TRANSITIONS) == set(Phase)
    assert {(a.value, b.value) for a, b in phases.NEEDS_NEW_CANARY} == {
        ("rolled_back", "progressing"),
        ("promoted", "progressing"),
    }


@pytest.mark.parametrize(
    ("current", "target"), [(a, b) for a, b in itertools.product(Phase, Phase) if a != b]
)
def test_check_transition_every_pair(current: Phase, target: Phase) -> None:
    extras = {
        "new_canary": (current, target) in phases.NEEDS_NEW_CANARY,
        "trip_given": target in phases.NEEDS_TRIP,
    }
    if (current.value, target.value) in CONTRACT_EDGES:
        phases.check_transition(current, target, **extras)
        return
    with pytest.raises(phases.IllegalTransition) as info:
        phases.check_transition(current, target, **extras)
    assert info.value.current == current
    assert info.value.allowed == sorted(t.value for t in phases.TRANSITIONS[current])
    assert f"{current.value} -> {target.value}" in info.value.message
    for allowed in info.value.allowed:
        assert allowed in info.value.message


def test_side_rules() -> None:
    with pytest.raises(phases.IllegalTransition, match="needs a new canary"):
        phases.check_transition(Phase.ROLLED_BACK, Phase.PROGRESSING)
    with pytest.raises(phases.IllegalTransition, match="needs a new canary"):
        phases.check_transition(Phase.PROMOTED, Phase.PROGRESSING)
    with pytest.raises(phases.IllegalTransition, match="needs trip evidence"):
        phases.check_transition(Phase.PROGRESSING, Phase.TRIPPED)
    with pytest.raises(phases.IllegalTransition, match="only accepted when the phase moves"):
        phases.check_transition(Phase.PROGRESSING, Phase.ROLLING_BACK, trip_given=True)
    with pytest.raises(phases.IllegalTransition, match="no canary version to promote"):
        phases.check_transition(Phase.PROGRESSING, Phase.PROMOTED, has_canary=False)
    # Resending the current phase is not a transition.
    for phase in Phase:
        phases.check_transition(phase, phase)
    phases.check_weight(Phase.PROGRESSING, 50, Phase.PROGRESSING)
    for phase in set(Phase) - {Phase.PROGRESSING}:
        phases.check_weight(phase, 0, phase)
        with pytest.raises(phases.IllegalTransition, match="weight above 0"):
            phases.check_weight(phase, 1, phase)
    with pytest.raises(ValueError, match="use one of progressing"):
        phases.parse_phase("done")


def test_manifest_digest_matches_the_contract() -> None:
    manifest = {"b": [1, 2], "a": "ü"}
    assert manifest_digest(manifest) == digest_of(manifest)
    assert manifest_digest("plain text ü") == digest_of("plain text ü")
    assert manifest_digest({"a": 1, "b": 2}) == manifest_digest({"b": 2, "a": 1})


# -- the store, in-process ------------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path)
    for v in ("v1", "v2", "v3"):
        s.register_version(v, manifest_digest({"v": v}), {"v": v}, 1.0)
    s.create_release("r", "v1", "v2", 5, "test", "", 2.0)
    return s


def test_store_settings_and_append_only_events(store: Store) -> None:
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 2  # FULL
    conn = sqlite3.connect(store.path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE events SET actor = 'mallory'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM events")
    conn.close()


def test_store_cas_and_no_op(store: Store) -> None:
    release, changed = store.patch_release("r", ReleasePatch(1, canary_weight=10), "a", "", 3.0)
    assert changed and release["revision"] == 2
    with pytest.raises(Conflicting) as info:
        store.patch_release("r", ReleasePatch(1, canary_weight=20), "a", "", 4.0)
    assert info.value.extra == {"current_revision": 2}
    assert info.value.param == "expected_revision" and info.value.code == "revision_conflict"
    # The same values again: no new revision, no event.
    same, changed = store.patch_release("r", ReleasePatch(2, canary_weight=10), "a", "", 5.0)
    assert not changed and same["revision"] == 2
    assert [e["revision"] for e in store.events("r")] == [1, 2]
    with pytest.raises(Missing) as missing:
        store.patch_release("nope", ReleasePatch(1), "a", "", 5.0)
    # The store speaks its own domain, not HTTP (#13 item 3): the HTTP layer maps it.
    assert not isinstance(missing.value, ApiError)
    assert isinstance(missing.value, BrokerDomainError)


def test_store_promotion_and_restart(store: Store, tmp_path: Path) -> None:
    release, _ = store.patch_release(
        "r", ReleasePatch(1, phase=Phase.PROMOTED, canary_weight=0), "a", "ship it", 3.0
    )
    assert release["stable"]["version"] == "v2"
    assert release["canary"] is None
    assert release["weights"]["canary"] == 0
    change = store.events("r")[-1]["change"]
    assert change["stable.version"] == {"old": "v1", "new": "v2"}
    assert change["canary.version"] == {"old": "v2", "new": None}
    assert change["phase"] == {"old": "progressing", "new": "promoted"}
    with pytest.raises(Conflicting, match="weight above 0"):
        store.patch_release("r", ReleasePatch(2, canary_weight=5), "a", "", 4.0)
    store.create_release("solo", "v1", None, 0, "test", "", 4.0)
    with pytest.raises(Refused, match="no canary"):
        store.patch_release("solo", ReleasePatch(1, canary_weight=5), "a", "", 4.0)
    store.close()
    reopened = Store.open(tmp_path)
    assert reopened.get_release("r") == release
    assert len(reopened.events("r")) == 2
    assert reopened.get_release("solo") is not None


def test_store_quarantine_bumps_releases_using_it(store: Store) -> None:
    store.create_release("other", "v1", "v3", 0, "test", "", 2.5)
    version, changed = store.quarantine_version("v2", "rollback", "drift", 3.0)
    assert version["quarantined"] and version["quarantine"]["reason"] == "drift"
    assert [r["name"] for r in changed] == ["r"]
    canary = changed[0]["canary"]
    assert canary is not None and canary["quarantined"] is True
    assert changed[0]["revision"] == 2
    assert store.events("r")[-1]["change"] == {"canary.quarantined": {"old": False, "new": True}}
    again, changed = store.quarantine_version("v2", "rollback", "drift", 4.0)
    assert again == version and changed == []
    assert store.get_release("other")["revision"] == 1  # type: ignore[index]


def test_store_trip_evidence_kept_then_cleared(store: Store) -> None:
    trip = trip_record()
    r, _ = store.patch_release("r", ReleasePatch(1, phase=Phase.TRIPPED, trip=trip), "gate", "", 3)
    assert r["trip"] == trip
    r, _ = store.patch_release(
        "r", ReleasePatch(2, phase=Phase.ROLLING_BACK, canary_weight=0), "rb", "", 4
    )
    assert r["trip"] == trip
    r, _ = store.patch_release("r", ReleasePatch(3, phase=Phase.ROLLED_BACK), "rb", "", 5)
    r, _ = store.patch_release(
        "r", ReleasePatch(4, phase=Phase.PROGRESSING, canary_set=True, canary="v3"), "a", "", 6
    )
    assert r["trip"] is None
    assert r["canary"] is not None and r["canary"]["version"] == "v3"
    assert r["weights"]["canary"] == 0
