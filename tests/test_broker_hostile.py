"""Hostile input against one real broker process (issue #12, items 3 and 9): every body,
query and header a client can send gets a 4xx that names the problem, nothing that is not
finite is stored or served, and the broker keeps serving the next request. Event
history is paged; the broker says how long a watch may be."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from canary_contract.broker import Event
from canarystack.broker.client import BrokerClient, BrokerRequestError
from tests.broker_support import (
    Api,
    digest_of,
    preload_history,
    start_broker,
    trip_evidence,
    trip_record,
)
from tests.procs import ADMIN_TOKEN, Spawner, wait_for

BODY_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("broker-hostile")
    spawner = Spawner(tmp)
    try:
        proc = start_broker(
            spawner, tmp / "state", "--max-watch-s", "20", "--router-expiry-s", "0.5"
        )
        client = Api(proc.url)
        for v in ("v1", "v2"):
            client.register(v)
        yield client
    finally:
        spawner.stop_all()


def _still_serving(api: Api, name: str) -> None:
    """After a hostile request: health, a read and a real write still work."""
    assert api.get("/health").status_code == 200
    before = api.release(name)
    after = api.patch_ok(name, weights={"canary": before["weights"]["canary"] % 50 + 1})
    assert after["revision"] == before["revision"] + 1


def _raw(api: Api, method: str, path: str, raw: bytes, **headers: str) -> requests.Response:
    return api.session.request(
        method,
        api.url + path,
        data=raw,
        headers={**api.headers, "Content-Type": "application/json", **headers},
        timeout=10,
    )


def _error(r: requests.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    return dict(body["error"])


# -- bodies: nothing non-finite is stored ------------------------------------------------
def test_nan_manifest_is_refused_not_stored(api: Api) -> None:
    name = api.create()["name"]
    # The digest the way a client that accepts NaN would compute it, so only the NaN is wrong.
    digest = digest_of({"scale": float("nan")})
    raw = b'{"version": "nan-v", "manifest": {"scale": NaN}, "digest": "%s"}' % digest.encode()
    r = _raw(api, "POST", "/v1/versions", raw)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert "NaN is not a JSON number" in err["message"]
    assert api.get("/v1/versions/nan-v").status_code == 404
    assert "NaN" not in api.get("/v1/versions").text
    _still_serving(api, name)


@pytest.mark.parametrize(
    ("path", "raw", "text"),
    [
        (
            "/v1/releases/{name}/events",
            b'{"actor": "t", "change": {"annotation": "x", "kl": Infinity}}',
            "Infinity is not a JSON number",
        ),
        (
            "/v1/releases/{name}/events",
            b'{"actor": "t", "change": {"annotation": "x", "kl": -Infinity}}',
            "-Infinity is not a JSON number",
        ),
        (
            "/v1/releases/{name}/events",
            b'{"actor": "t", "change": {"annotation": "x", "kl": 1e400}}',
            "overflows a double",
        ),
        (
            "/v1/releases/{name}/events",
            b'{"actor": "t", "change": {"annotation": "x", "n": ' + b"9" * 4000 + b"}}",
            "4000 digits",
        ),
        (
            "/v1/releases/{name}/events",
            b'{"actor": "t", "change": {"annotation": "x"}, "reason": "hello \\ud800"}',
            "lone surrogate",
        ),
        ("/v1/releases/{name}/events", b'{"actor": "t", "change": "\xff\xfe"}', "UTF-8"),
        ("/v1/releases/{name}/events", b"[" * 100_000 + b"]" * 100_000, "nested"),
    ],
)
def test_hostile_annotation_bodies_get_400_and_nothing_is_stored(
    api: Api, path: str, raw: bytes, text: str
) -> None:
    name = api.create()["name"]
    r = _raw(api, "POST", path.format(name=name), raw)
    assert r.status_code == 400, r.text
    assert text in _error(r)["message"]
    assert len(api.events(name)) == 1  # only the creation
    _still_serving(api, name)


def test_non_finite_trip_evidence_is_refused(api: Api) -> None:
    name = api.create()["name"]
    body = json.dumps(
        {"expected_revision": 1, "actor": "t", "phase": "tripped", "trip": trip_evidence()}
    )
    raw = body.replace('"statistic": 0.31', '"statistic": 1e999').encode()
    assert b"1e999" in raw
    r = _raw(api, "PATCH", f"/v1/releases/{name}", raw)
    assert r.status_code == 400, r.text
    assert api.release(name)["phase"] == "progressing"
    _still_serving(api, name)


@pytest.mark.parametrize(
    ("field", "value"),
    [("expected_revision", 2**63), ("expected_revision", 10**30)],
)
def test_integers_beyond_64_bits_name_the_field(api: Api, field: str, value: int) -> None:
    name = api.create()["name"]
    r = api.write("PATCH", f"/v1/releases/{name}", {"actor": "t", field: value})
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == field
    assert "less than or equal to 9223372036854775807" in err["message"]


def test_heartbeat_revision_beyond_64_bits_is_refused(api: Api) -> None:
    beat = {"router_id": "big", "release": "x", "applied_revision": 2**64}
    r = api.write("POST", "/v1/routers/heartbeat", beat)
    assert r.status_code == 400 and _error(r)["param"] == "applied_revision", r.text
    assert all(r["router_id"] != "big" for r in api.get("/v1/routers").json()["routers"])


# -- body size -----------------------------------------------------------------------------
def test_a_body_over_the_limit_gets_413_naming_it(api: Api) -> None:
    name = api.create()["name"]
    big = json.dumps({"actor": "t", "change": {"annotation": "x", "pad": "a" * BODY_LIMIT}})
    r = _raw(api, "POST", f"/v1/releases/{name}/events", big.encode())
    assert r.status_code == 413, r.text
    err = _error(r)
    assert str(BODY_LIMIT) in err["message"] and err["code"] == "body_too_large"
    assert r.json()["max_bytes"] == BODY_LIMIT
    _still_serving(api, name)


def test_a_huge_content_length_is_refused_before_reading(api: Api) -> None:
    name = api.create()["name"]
    host, port = api.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        # Says 10 GiB, sends 2 bytes: the answer comes without waiting for the rest.
        conn.putrequest("POST", f"/v1/releases/{name}/events")
        conn.putheader("Authorization", f"Bearer {ADMIN_TOKEN}")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(10 * 1024**3))
        conn.endheaders()
        conn.send(b"{}")
        resp = conn.getresponse()
        body = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 413
    assert "10737418240 bytes (Content-Length)" in body["error"]["message"]
    _still_serving(api, name)


def test_a_chunked_body_over_the_limit_gets_413(api: Api) -> None:
    name = api.create()["name"]

    def chunks() -> Iterator[bytes]:
        yield b'{"actor": "t", "change": {"annotation": "x", "pad": "'
        for _ in range(BODY_LIMIT // 4096 + 2):
            yield b"a" * 4096
        yield b'"}}'

    r = api.session.post(
        api.url + f"/v1/releases/{name}/events",
        data=chunks(),
        headers={**api.headers, "Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 413, r.text
    _still_serving(api, name)


# -- queries -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "params", "param", "text"),
    [
        ("/events", {"after_seq": str(2**63)}, "after_seq", "from 0 to 9223372036854775807"),
        ("/events", {"after_seq": "9" * 5000}, "after_seq", "digits only"),
        ("/events", {"after_seq": "1_000"}, "after_seq", "digits only"),
        ("/events", {"after_seq": " 5"}, "after_seq", "digits only"),
        ("/events", {"after_seq": "-1"}, "after_seq", "from 0 to"),
        ("/events", {"limit": "0"}, "limit", "from 1 to 10000"),
        ("/events", {"limit": "10001"}, "limit", "from 1 to 10000"),
        ("/events", {"limit": str(2**64)}, "limit", "from 1 to 10000"),
        ("", {"after": str(2**63)}, "after", "from 0 to 9223372036854775807"),
        ("", {"after": "1", "timeout_s": "1e400"}, "timeout_s", "as a finite decimal number"),
        ("", {"after": "1", "timeout_s": "inf"}, "timeout_s", "as a finite decimal number"),
        ("", {"after": "1", "timeout_s": "1_0"}, "timeout_s", "as a finite decimal number"),
        ("", {"after": "1", "timeout_s": "1e3"}, "timeout_s", "<= 20"),
    ],
)
def test_bounded_query_integers(
    api: Api, path: str, params: dict[str, str], param: str, text: str
) -> None:
    name = api.create()["name"]
    r = api.get(f"/v1/releases/{name}{path}", params=params)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == param
    assert text in err["message"]
    _still_serving(api, name)


# -- headers ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("actor", "text"),
    [(b"\xff\xfe operator", "not valid UTF-8"), (b"a" * 5000, "at most 200 characters")],
)
def test_x_actor_header_that_cannot_be_stored_gets_400(api: Api, actor: bytes, text: str) -> None:
    name = api.create()["name"]
    r = api.session.patch(
        api.url + f"/v1/releases/{name}",
        data=json.dumps({"expected_revision": 1, "weights": {"canary": 9}}),
        headers={**api.headers, "Content-Type": "application/json", "x-actor": actor},
        timeout=10,
    )
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == "x-actor" and text in err["message"]
    assert api.release(name)["revision"] == 1
    _still_serving(api, name)


# -- event history is paged ------------------------------------------------------------------
def test_events_page_with_next_after_seq(api: Api) -> None:
    name = api.create()["name"]
    for w in range(10, 17):
        api.patch_ok(name, weights={"canary": w})
    everything = api.events_page(name)["events"]
    assert len(everything) == 8
    pages: list[list[dict[str, Any]]] = []
    after = 0
    while True:
        page = api.events_page(name, after_seq=after, limit=3)
        assert page["limit"] == 3
        pages.append(page["events"])
        if page["events"]:
            assert page["next_after_seq"] == page["events"][-1]["seq"]
        else:
            assert page["next_after_seq"] == after
        if len(page["events"]) < 3:
            break
        after = page["next_after_seq"]
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [e for p in pages for e in p] == everything


def test_the_client_reads_every_page_of_a_long_history(spawn: Spawner, tmp_path: Path) -> None:
    state = tmp_path / "state"
    preload_history(state, 10_050)  # more than one 10,000-event page
    proc = start_broker(spawn, state)
    api = Api(proc.url)
    api.patch_ok("default", weights={"canary": 7}, reason="the newest event")
    first = api.events_page("default")
    assert len(first["events"]) == 10_000 and first["limit"] == 10_000

    async def read() -> list[Event]:
        async with aiohttp.ClientSession() as session:
            client = BrokerClient(session, proc.url, ADMIN_TOKEN, actor="t")
            return await client.events("default")

    events = asyncio.run(read())
    assert len(events) == 1 + 10_050 + 1
    assert events[-1].reason == "the newest event"
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))


# -- what the broker says about itself -------------------------------------------------------
def test_watch_timeouts_as_the_client_writes_them(api: Api) -> None:
    release = api.create()
    for written in ("1e-2", "0.01", "2"):
        r = api.get(f"/v1/releases/{release['name']}", params={"after": 1, "timeout_s": written})
        assert r.status_code == 200 and r.headers["x-watch-timeout"] == "true", written


def test_health_says_max_watch_s(api: Api) -> None:
    health = api.get("/health").json()
    assert health["max_watch_s"] == 20
    assert health["router_expiry_s"] == 0.5


def test_quiet_routers_are_listed_as_recent(api: Api) -> None:
    beat = {"router_id": "quiet-1", "release": "q", "applied_revision": 3}
    assert api.write("POST", "/v1/routers/heartbeat", beat).status_code == 200
    live = api.get("/v1/routers", params={"release": "q"}).json()
    assert [r["router_id"] for r in live["routers"]] == ["quiet-1"]
    assert live["recent"] == [] and live["recent_s"] == 1.5

    def gone_but_recent() -> dict[str, Any] | None:
        body = api.get("/v1/routers", params={"release": "q"}).json()
        return body if not body["routers"] and body["recent"] else None

    body = wait_for(gone_but_recent, timeout=5, what="the router to expire into recent")
    assert isinstance(body, dict)
    assert [(r["router_id"], r["applied_revision"]) for r in body["recent"]] == [("quiet-1", 3)]
    # A new heartbeat makes it live again, and no longer recent.
    assert api.write("POST", "/v1/routers/heartbeat", beat).status_code == 200
    again = api.get("/v1/routers", params={"release": "q"}).json()
    assert [r["router_id"] for r in again["routers"]] == ["quiet-1"] and again["recent"] == []


# -- the client never sends what the broker must refuse --------------------------------------
def test_the_client_refuses_to_send_nan(api: Api) -> None:
    name = api.create()["name"]

    async def send() -> BrokerRequestError:
        async with aiohttp.ClientSession() as session:
            client = BrokerClient(session, api.url, ADMIN_TOKEN, actor="gate")
            with pytest.raises(BrokerRequestError) as refused:
                await client.patch_release(
                    name,
                    1,
                    phase="tripped",
                    trip=trip_record(statistic=float("nan"), tripped_at=time.time()),
                )
            return refused.value

    err = asyncio.run(send())
    assert err.status == 400 and err.code == "non_finite"
    assert "non-finite" in err.message
    assert api.release(name)["phase"] == "progressing"


# -- flags -----------------------------------------------------------------------------------
def test_infinite_durations_are_refused_at_start(tmp_path: Path) -> None:
    for flag in ("--max-watch-s", "--router-expiry-s"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "canarystack.broker",
                "--state-dir",
                str(tmp_path / "state"),
                flag,
                "inf",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2, done.stderr
        assert f"{flag} must be a finite number of seconds > 0, got inf" in done.stderr


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/releases/{name}/events",
            {"actor": "t", "change": {"annotation": "x", "pad": "a" * 20_000}},
            "change",
        ),
        (
            "/v1/releases/{name}",
            {
                "actor": "t",
                "expected_revision": 1,
                "phase": "tripped",
                "trip": trip_evidence(detail={"pad": "a" * 20_000}),
            },
            "trip.detail",
        ),
    ],
)
def test_what_goes_into_every_page_of_history_stays_small(
    api: Api, path: str, body: dict[str, Any], param: str
) -> None:
    name = api.create()["name"]
    method = "PATCH" if path.endswith("}") and "events" not in path else "POST"
    r = api.write(method, path.format(name=name), body)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == param
    assert "over the limit of 16384" in err["message"]
    assert len(api.events(name)) == 1
    _still_serving(api, name)
