"""The broker's HTTP API against one real broker process (shared by this module):
compare-and-set, watch, every phase transition, digests, auth, events and bad input."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from canarystack.broker import phases
from canarystack.broker.phases import Phase
from tests.broker_support import Api, digest_of, drive_to, start_broker, trip_evidence
from tests.procs import Spawner, wait_for


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("broker-api")
    spawner = Spawner(tmp)
    try:
        proc = start_broker(spawner, tmp / "state", "--max-watch-s", "20")
        client = Api(proc.url)
        for v in ("v1", "v2", "v3", "v4"):
            client.register(v)
        yield client
    finally:
        spawner.stop_all()


def _error(r: requests.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    return dict(body)


# -- compare-and-set ---------------------------------------------------------------------
def _race(url: str, name: str, revision: int, weights: tuple[int, int]) -> list[requests.Response]:
    """Two PATCHes with the same expected_revision, released at the same moment."""
    barrier = threading.Barrier(2)
    results: list[requests.Response] = []
    lock = threading.Lock()

    def writer(weight: int) -> None:
        own = Api(url)  # its own connection, so the two really race
        barrier.wait()
        r = own.patch(name, revision, weights={"canary": weight})
        with lock:
            results.append(r)

    threads = [threading.Thread(target=writer, args=(w,)) for w in weights]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    return results


def test_cas_two_writers_one_wins(api: Api) -> None:
    name = api.create()["name"]
    for round_no in range(5):
        revision = api.release(name)["revision"]
        # Two values never set before, so neither write is a no-op.
        results = _race(api.url, name, revision, (2 * round_no + 1, 2 * round_no + 2))
        statuses = sorted(r.status_code for r in results)
        assert statuses == [200, 409], [r.text for r in results]
        loser = next(r for r in results if r.status_code == 409)
        winner = next(r for r in results if r.status_code == 200)
        body = _error(loser)
        assert body["current_revision"] == revision + 1
        assert body["error"]["code"] == "revision_conflict"
        assert f"expected_revision is {revision}" in body["error"]["message"]
        assert winner.json()["revision"] == revision + 1
        assert api.release(name)["weights"] == winner.json()["weights"]


def test_patch_with_unchanged_values_keeps_the_revision(api: Api) -> None:
    release = api.create(weight=7)
    r = api.patch(release["name"], 1, weights={"canary": 7}, phase="progressing")
    assert r.status_code == 200
    assert r.json()["revision"] == 1
    assert len(api.events(release["name"])) == 1


# -- watch -------------------------------------------------------------------------------
def _watch_in_thread(api: Api, path: str, params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def run() -> None:
        out["response"] = requests.get(api.url + path, params=params, timeout=30)

    out["thread"] = threading.Thread(target=run)
    out["thread"].start()
    return out


def test_watch_returns_on_a_change(api: Api) -> None:
    release = api.create()
    name, rev = release["name"], release["revision"]
    before = api.watchers()
    pending = _watch_in_thread(api, f"/v1/releases/{name}", {"after": rev, "timeout_s": 20})
    wait_for(lambda: api.watchers() > before, what="the watch to be waiting")
    assert api.patch(name, rev, weights={"canary": 25}).status_code == 200
    pending["thread"].join(timeout=15)
    assert not pending["thread"].is_alive(), "the watch did not return after the change"
    r = pending["response"]
    assert r.status_code == 200
    assert "x-watch-timeout" not in r.headers
    assert r.json()["revision"] == rev + 1
    assert r.json()["weights"]["canary"] == 25


def test_watch_returns_at_once_when_already_newer(api: Api) -> None:
    release = api.create()
    r = api.get(f"/v1/releases/{release['name']}", params={"after": 0, "timeout_s": 20})
    assert r.status_code == 200 and "x-watch-timeout" not in r.headers
    assert r.json()["revision"] == 1


def test_watch_from_a_client_ahead_of_the_broker_returns_at_once(api: Api) -> None:
    """A revision above the broker's came from another database: answer, don't wait."""
    release = api.create()
    r = api.get(f"/v1/releases/{release['name']}", params={"after": 999, "timeout_s": 20})
    assert r.status_code == 200 and "x-watch-timeout" not in r.headers
    assert r.json()["revision"] == 1


def test_watch_times_out_with_the_header(api: Api) -> None:
    release = api.create()
    started = time.monotonic()
    r = api.get(f"/v1/releases/{release['name']}", params={"after": 1, "timeout_s": 0.3})
    assert time.monotonic() - started >= 0.3
    assert r.status_code == 200
    assert r.headers["x-watch-timeout"] == "true"
    assert r.json() == api.release(release["name"])


def test_watch_waits_for_a_release_to_be_created(api: Api) -> None:
    name = "born-later"
    before = api.watchers()
    pending = _watch_in_thread(api, f"/v1/releases/{name}", {"after": 0, "timeout_s": 20})
    wait_for(lambda: api.watchers() > before, what="the watch to be waiting")
    api.create(name)
    pending["thread"].join(timeout=15)
    assert pending["response"].status_code == 200
    assert pending["response"].json()["name"] == name
    r = api.get("/v1/releases/never-made", params={"after": 0, "timeout_s": 0.2})
    assert r.status_code == 404
    assert "never-made" in _error(r)["error"]["message"]


@pytest.mark.parametrize(
    ("params", "param", "text"),
    [
        ({"after": "abc"}, "after", "whole number"),
        ({"after": "-1"}, "after", "from 0 to 9223372036854775807"),
        ({"after": "1", "timeout_s": "0"}, "timeout_s", "<= 20"),
        ({"after": "1", "timeout_s": "-3"}, "timeout_s", "> 0"),
        ({"after": "1", "timeout_s": "soon"}, "timeout_s", "'soon'"),
        ({"after": "1", "timeout_s": "nan"}, "timeout_s", "seconds"),
        ({"after": "1", "timeout_s": "21"}, "timeout_s", "--max-watch-s"),
        ({"timeout_s": "5"}, "timeout_s", "give 'after'"),
    ],
)
def test_watch_query_is_validated(api: Api, params: dict[str, str], param: str, text: str) -> None:
    name = api.create()["name"]
    r = api.get(f"/v1/releases/{name}", params=params)
    assert r.status_code == 400
    err = _error(r)["error"]
    assert err["param"] == param
    assert text in err["message"]


# -- transitions -------------------------------------------------------------------------
_new_canary = itertools.cycle(["v3", "v4"])


@pytest.mark.parametrize(
    ("current", "target"), [(a, b) for a, b in itertools.product(Phase, Phase) if a != b]
)
def test_every_transition(api: Api, current: Phase, target: Phase) -> None:
    """Every ordered pair of phases over HTTP, with the extras the target needs."""
    release = api.create()
    name = release["name"]
    release = drive_to(api, name, current.value)
    body: dict[str, Any] = {"phase": target.value}
    if target in phases.NEEDS_TRIP:
        body["trip"] = trip_evidence()
    if target == Phase.PROGRESSING:
        body["canary"] = next(_new_canary)
    r = api.patch(name, release["revision"], **body)
    if target in phases.TRANSITIONS[current]:
        assert r.status_code == 200, r.text
        after = r.json()
        assert after["phase"] == target.value
        assert after["revision"] == release["revision"] + 1
        event = api.events(name)[-1]
        assert event["revision"] == after["revision"]
        assert event["change"]["phase"] == {"old": current.value, "new": target.value}
        assert event["actor"] == "test"
    else:
        assert r.status_code == 409, r.text
        body_409 = _error(r)
        assert body_409["current_phase"] == current.value
        assert body_409["allowed"] == sorted(p.value for p in phases.TRANSITIONS[current])
        assert body_409["error"]["code"] == "illegal_transition"
        assert api.release(name)["revision"] == release["revision"]


def test_rolled_back_returns_only_with_a_new_usable_canary(api: Api) -> None:
    name = api.create(canary="v2")["name"]
    rev = drive_to(api, name, "rolled_back")["revision"]
    r = api.patch(name, rev, phase="progressing")
    assert r.status_code == 409 and "needs a new canary" in _error(r)["error"]["message"]
    r = api.patch(name, rev, phase="progressing", canary="v2")
    assert r.status_code == 409 and "needs a new canary" in _error(r)["error"]["message"]
    r = api.patch(name, rev, phase="progressing", canary="v9")
    assert r.status_code == 422
    assert _error(r)["error"]["code"] == "unknown_version"
    api.register("bad")
    assert api.write("POST", "/v1/versions/bad/quarantine", {"actor": "t"}).status_code == 200
    r = api.patch(name, rev, phase="progressing", canary="bad")
    assert r.status_code == 422
    assert _error(r)["error"]["code"] == "version_quarantined"
    r = api.patch(name, rev, phase="progressing", canary="v3", weights={"canary": 1})
    assert r.status_code == 200, r.text
    assert r.json()["canary"]["version"] == "v3"
    assert r.json()["weights"]["canary"] == 1
    assert r.json()["trip"] is None


def test_promotion_moves_canary_to_stable(api: Api) -> None:
    name = api.create(stable="v1", canary="v2", weight=50)["name"]
    promoted = drive_to(api, name, "promoted")
    assert promoted["stable"] == {"version": "v2", "digest": digest_of({"image": "model:v2"})}
    assert promoted["canary"] is None
    assert promoted["weights"]["canary"] == 0
    r = api.patch(name, promoted["revision"], phase="progressing")
    assert r.status_code == 409 and "needs a new canary" in r.text
    r = api.patch(name, promoted["revision"], phase="progressing", canary="v3")
    assert r.status_code == 200 and r.json()["stable"]["version"] == "v2"


@pytest.mark.parametrize(
    ("phase", "body", "text"),
    [
        ("tripped", {"weights": {"canary": 5}}, "weight above 0"),
        ("rolled_back", {"weights": {"canary": 1}}, "weight above 0"),
        ("progressing", {"phase": "rolling_back", "weights": {"canary": 5}}, "weight above 0"),
        ("progressing", {"phase": "promoted", "weights": {"canary": 5}}, "weight above 0"),
        ("progressing", {"phase": "tripped"}, "needs trip evidence"),
        ("progressing", {"phase": "rolling_back", "trip": trip_evidence()}, "only accepted"),
        ("tripped", {"phase": "tripped", "trip": trip_evidence()}, "already tripped"),
        ("tripped", {"canary": "v3"}, "cannot change in phase tripped"),
        ("progressing", {"phase": "promoted", "canary": "v3"}, "cannot change"),
    ],
)
def test_phase_side_rules(api: Api, phase: str, body: dict[str, Any], text: str) -> None:
    name = api.create()["name"]
    release = drive_to(api, name, phase)
    r = api.patch(name, release["revision"], **body)
    assert r.status_code == 409, r.text
    assert text in _error(r)["error"]["message"]
    assert _error(r)["current_phase"] == phase


def test_weights_zero_allowed_in_any_phase_and_canary_swap_while_progressing(api: Api) -> None:
    name = api.create()["name"]
    release = drive_to(api, name, "tripped")
    assert release["weights"]["canary"] == 5  # tripping does not touch weights by itself
    assert api.patch_ok(name, weights={"canary": 0})["weights"]["canary"] == 0
    other = api.create()["name"]
    swapped = api.patch_ok(other, canary="v3", weights={"canary": 2.5})
    assert swapped["canary"]["version"] == "v3"
    assert swapped["weights"]["canary"] == 2.5


def test_quarantine_marks_the_canary_and_bumps_the_revision(api: Api) -> None:
    api.register("q1")
    name = api.create(canary="q1")["name"]
    r = api.write("POST", "/v1/versions/q1/quarantine", {"actor": "rollback", "reason": "drift"})
    assert r.status_code == 200 and r.json()["quarantined"] is True
    release = api.release(name)
    assert release["canary"]["quarantined"] is True
    assert release["revision"] == 2
    event = api.events(name)[-1]
    assert event["actor"] == "rollback" and event["reason"] == "drift"
    again = api.write("POST", "/v1/versions/q1/quarantine", {"actor": "rollback"})
    assert again.status_code == 200 and api.release(name)["revision"] == 2
    assert api.write("POST", "/v1/versions/zz/quarantine", {"actor": "x"}).status_code == 404
    # No body at all: the actor may come from the x-actor header.
    api.register("q2")
    r = api.session.post(
        api.url + "/v1/versions/q2/quarantine", headers={**api.headers, "x-actor": "ops"}
    )
    assert r.status_code == 200 and r.json()["quarantine"]["actor"] == "ops"
    r = api.session.post(api.url + "/v1/versions/q2/quarantine", headers=api.headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "actor"


# -- versions and digests ------------------------------------------------------------------
def test_register_version_checks_the_digest(api: Api) -> None:
    manifest = {"image": "model:d1", "engine": "sim"}
    wrong = digest_of({"image": "something else"})
    r = api.write("POST", "/v1/versions", {"version": "d1", "manifest": manifest, "digest": wrong})
    assert r.status_code == 422
    body = _error(r)
    assert wrong in body["error"]["message"]
    assert digest_of(manifest) in body["error"]["message"]
    assert body["error"]["param"] == "digest"
    assert api.get("/v1/versions/d1").status_code == 404

    good = {"version": "d1", "manifest": manifest, "digest": digest_of(manifest)}
    first = api.write("POST", "/v1/versions", good)
    assert first.status_code == 201
    assert first.json()["digest"] == digest_of(manifest)
    again = api.write("POST", "/v1/versions", good)
    assert again.status_code == 200 and again.json() == first.json()
    other = {"version": "d1", "manifest": "x", "digest": digest_of("x")}
    r = api.write("POST", "/v1/versions", other)
    assert r.status_code == 409 and _error(r)["error"]["code"] == "version_conflict"

    text = "FROM model:v7\nENV KV_CACHE=fp8 ü"
    r = api.write(
        "POST", "/v1/versions", {"version": "s1", "manifest": text, "digest": digest_of(text)}
    )
    assert r.status_code == 201
    assert api.get("/v1/versions/s1").json()["manifest"] == text
    listed = [v["version"] for v in api.get("/v1/versions").json()["versions"]]
    assert {"d1", "s1", "v1"} <= set(listed)


def test_create_release_refuses_unknown_versions_and_duplicates(api: Api) -> None:
    base = {"stable": "v1", "canary": "v2", "weights": {"canary": 5}, "actor": "t"}
    r = api.write("POST", "/v1/releases", {**base, "name": "dup"})
    assert r.status_code == 201 and r.json()["revision"] == 1
    r = api.write("POST", "/v1/releases", {**base, "name": "dup"})
    assert r.status_code == 409 and _error(r)["error"]["code"] == "release_exists"
    r = api.write("POST", "/v1/releases", {**base, "name": "u1", "stable": "nope"})
    assert r.status_code == 422 and _error(r)["error"]["param"] == "stable"
    r = api.write("POST", "/v1/releases", {**base, "name": "u2", "canary": "nope"})
    assert r.status_code == 422 and _error(r)["error"]["param"] == "canary"
    r = api.write("POST", "/v1/releases", {**base, "name": "u3", "canary": None})
    assert r.status_code == 422 and _error(r)["error"]["param"] == "weights.canary"
    names = [x["name"] for x in api.get("/v1/releases").json()["releases"]]
    assert "dup" in names and "u1" not in names


# -- auth --------------------------------------------------------------------------------
WRITES = [
    ("POST", "/v1/versions", {"version": "a1", "manifest": "m", "digest": digest_of("m")}),
    ("POST", "/v1/versions/v1/quarantine", {"actor": "x"}),
    ("POST", "/v1/releases", {"name": "a1", "stable": "v1", "actor": "x"}),
    ("PATCH", "/v1/releases/authrel", {"expected_revision": 1, "actor": "x"}),
    ("POST", "/v1/releases/authrel/events", {"actor": "x", "change": {"annotation": "a"}}),
    ("POST", "/v1/routers/heartbeat", {"router_id": "r", "release": "x", "applied_revision": 1}),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_writes_need_the_admin_token(api: Api, method: str, path: str, body: Any) -> None:
    if api.get("/v1/releases/authrel").status_code == 404:
        api.create("authrel")
    for token in (None, "wrong-token"):
        r = Api(api.url, token=token).write(method, path, body)
        assert r.status_code == 401, r.text
        assert _error(r)["error"]["type"] == "authentication_error"
    assert api.release("authrel")["revision"] == 1
    assert api.get("/v1/versions/v1").json()["quarantined"] is False


def test_reads_are_open(api: Api) -> None:
    name = api.create()["name"]
    anonymous = Api(api.url, token=None)
    for path in (
        "/v1/releases",
        f"/v1/releases/{name}",
        f"/v1/releases/{name}/events",
        "/v1/versions",
        "/v1/versions/v1",
        "/v1/routers",
        "/health",
    ):
        assert anonymous.get(path).status_code == 200, path


# -- events ------------------------------------------------------------------------------
def test_event_history(api: Api) -> None:
    name = api.create(weight=5)["name"]
    api.patch_ok(name, weights={"canary": 20}, reason="more traffic")
    r = api.write(
        "POST",
        f"/v1/releases/{name}/events",
        {"actor": "gameday", "change": {"annotation": "fault_injected", "kind": "latency"}},
    )
    assert r.status_code == 201
    note = r.json()
    assert note["revision"] == 2  # annotations do not change the revision
    assert api.release(name)["revision"] == 2
    drive_to(api, name, "tripped")
    events = api.events(name)
    assert [e["revision"] for e in events] == [1, 2, 2, 3]
    assert [e["actor"] for e in events] == ["test", "test", "gameday", "test"]
    assert events[0]["change"]["weights.canary"] == {"old": None, "new": 5}
    assert events[1]["change"] == {"weights.canary": {"old": 5, "new": 20}}
    assert events[1]["reason"] == "more traffic"
    assert events[2]["change"]["annotation"] == "fault_injected"
    assert events[3]["change"]["phase"] == {"old": "progressing", "new": "tripped"}
    assert events[3]["change"]["trip"]["old"] is None
    assert events[3]["change"]["trip"]["new"]["bucket"] == "2k-4k"
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    assert api.events(name, after_seq=seqs[1]) == events[2:]
    assert all(e["time"] > 1e9 for e in events)
    assert api.get("/v1/releases/nope/events").status_code == 404
    r = api.get(f"/v1/releases/{name}/events", params={"after_seq": "x"})
    assert r.status_code == 400 and _error(r)["error"]["param"] == "after_seq"


# -- malformed bodies --------------------------------------------------------------------
BAD_PATCHES = [
    ({"weights": {"canary": 5}}, "expected_revision", "Field required"),
    ({"expected_revision": "1"}, "expected_revision", "valid integer"),
    ({"expected_revision": True}, "expected_revision", "valid integer"),
    ({"expected_revision": 1, "weights": {"canary": 150}}, "weights.canary", "less than"),
    ({"expected_revision": 1, "weights": {"canary": -1}}, "weights.canary", "greater than"),
    ({"expected_revision": 1, "weights": {"canary": "5"}}, "weights.canary", "valid number"),
    ({"expected_revision": 1, "weights": {"canry": 5}}, "weights.canary", "Field required"),
    ({"expected_revision": 1, "phase": "done"}, "phase", "'progressing'"),
    ({"expected_revision": 1, "phase": "tripped", "trip": {"test": "drift"}}, "trip.bucket", ""),
    ({"expected_revision": 1, "trip": trip_evidence(test="vibes")}, "trip.test", "'drift'"),
    ({"expected_revision": 1, "trip": trip_evidence(samples=-1)}, "trip.samples", ""),
    ({"expected_revision": 1, "trip": trip_evidence(statistic="big")}, "trip.statistic", ""),
    (
        {"expected_revision": 1, "trip": trip_evidence(first_sample_time=2, last_sample_time=1)},
        "trip",
        "before trip.first_sample_time",
    ),
    ({"expected_revision": 1, "canary": "has space"}, "canary", "pattern"),
    ({"expected_revision": 1, "colour": "red"}, "colour", "Extra inputs"),
]


@pytest.mark.parametrize(("body", "param", "text"), BAD_PATCHES)
def test_bad_patch_bodies_name_the_field(
    api: Api, body: dict[str, Any], param: str, text: str
) -> None:
    name = api.create()["name"]
    r = api.write("PATCH", f"/v1/releases/{name}", {"actor": "t", **body})
    assert r.status_code == 400, r.text
    err = _error(r)["error"]
    assert err["param"] == param
    assert param in err["message"]
    assert text in err["message"]
    assert api.release(name)["revision"] == 1


@pytest.mark.parametrize(
    ("method", "path", "raw", "param", "text"),
    [
        ("PATCH", "/v1/releases/{name}", b"{not json", None, "not valid JSON"),
        ("PATCH", "/v1/releases/{name}", b"[1, 2]", None, "JSON object"),
        ("PATCH", "/v1/releases/{name}", b"", None, "empty"),
        ("PATCH", "/v1/releases/{name}", b'{"expected_revision": 1}', "actor", "actor"),
        ("POST", "/v1/releases", b'{"name": "x y", "stable": "v1", "actor": "t"}', "name", ""),
        ("POST", "/v1/releases", b'{"stable": "v1", "actor": "t"}', "name", "required"),
        ("POST", "/v1/versions", b'{"version": "m1", "digest": "sha256:00"}', "manifest", ""),
        (
            "POST",
            "/v1/versions",
            b'{"version": "m1", "manifest": 1, "digest": "md5:x"}',
            "digest",
            "",
        ),
        ("POST", "/v1/releases/{name}/events", b'{"actor": "t", "change": {}}', None, "annotation"),
        ("POST", "/v1/releases/{name}/events", b'{"actor": "t"}', "change", "required"),
        (
            "POST",
            "/v1/routers/heartbeat",
            b'{"router_id": "r", "release": "x"}',
            "applied_revision",
            "",
        ),
        (
            "POST",
            "/v1/routers/heartbeat",
            b'{"router_id": "", "release": "x", "applied_revision": 1}',
            "router_id",
            "",
        ),
        (
            "POST",
            "/v1/routers/heartbeat",
            b'{"router_id": "r", "release": "x", "applied_revision": 1, "applied_at": "now"}',
            "applied_at",
            "",
        ),
        (
            "POST",
            "/v1/routers/heartbeat",
            b'{"router_id": "r", "release": "x", "applied_revision": 1, "canary_off_since": -1}',
            "canary_off_since",
            "",
        ),
        (
            "POST",
            "/v1/routers/heartbeat",
            b'{"router_id": "r", "release": "x", "applied_revision": 1, '
            b'"canary_off_since": Infinity}',
            None,
            "non-finite values are refused",
        ),
    ],
)
def test_malformed_bodies_get_400(
    api: Api, method: str, path: str, raw: bytes, param: str | None, text: str
) -> None:
    name = api.create()["name"]
    r = api.session.request(
        method,
        api.url + path.format(name=name),
        data=raw,
        headers={**api.headers, "Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400, r.text
    err = _error(r)["error"]
    assert err["param"] == param
    assert text in err["message"]


def test_unknown_release_and_bad_names(api: Api) -> None:
    assert api.get("/v1/releases/absent").status_code == 404
    assert api.patch("absent", 1, weights={"canary": 0}).status_code == 404
    r = api.get("/v1/releases/bad%20name")
    assert r.status_code == 400 and _error(r)["error"]["param"] == "name"


def _writes(api: Api, kind: str, outcome: str) -> float:
    pattern = re.compile(
        rf'^canarystack_broker_writes_total\{{kind="{kind}",outcome="{outcome}"\}} (\S+)$', re.M
    )
    m = pattern.search(api.get("/metrics").text)
    return float(m.group(1)) if m else 0.0


def test_refused_writes_are_counted_under_their_status_name(api: Api) -> None:
    # The store raises domain errors now (#13 item 3); the metric keeps the labels it had.
    name = api.create()["name"]
    before = {o: _writes(api, "patch_release", o) for o in ("Conflict", "NotFound")}
    r = api.patch(name, 99, weights={"canary": 7})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "revision_conflict"
    r = api.patch("no-such-release", 1, weights={"canary": 7})
    assert r.status_code == 404, r.text
    assert _writes(api, "patch_release", "Conflict") == before["Conflict"] + 1
    assert _writes(api, "patch_release", "NotFound") == before["NotFound"] + 1
    assert _writes(api, "patch_release", "Conflicting") == 0
