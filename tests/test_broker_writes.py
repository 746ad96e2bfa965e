"""``gameday.targets.broker_writes``: the broker reads and writes of a cluster's fresh
canary, with the HTTP calls faked (the real broker: tests/test_k8s_fresh_canary.py).

- a compare-and-set PATCH is retried on a revision conflict and refused otherwise;
- an unreachable broker, a refused registration, a broker that cannot say: RolloutError
  with a whole message naming what failed;
- a fresh version name drops the previous one's ``-g<ms>`` and skips names the broker knows;
- a session handed in carries every read and write (else each call makes its own).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from canary_contract.digest import manifest_digest
from gameday.api import ApiError
from gameday.evidence.rollouts import RolloutError
from gameday.targets import broker_writes as bw

BROKER = "http://broker.test"


class FakeTarget:
    release = "default"

    def service_url(self, role: str) -> str:
        assert role == "broker"
        return BROKER

    def operator_headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer op"}

    def observer(self) -> None:
        return None  # canarystack's gate: StackApi reads it from the broker


def response(status: int, body: object) -> requests.Response:
    resp = requests.Response()
    resp.status_code = status
    resp._content = json.dumps(body).encode()
    return resp


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, Any]]:
    made: list[tuple[str, str, Any]] = []
    monkeypatch.setattr(bw, "release", lambda target, **kw: {"revision": len(made) + 1})
    return made


def answer(monkeypatch: pytest.MonkeyPatch, made: list[Any], *answers: requests.Response) -> None:
    queue = list(answers)

    def request(_: requests.Session, method: str, url: str, **kwargs: Any) -> requests.Response:
        made.append((method, url, kwargs))
        return queue.pop(0)

    monkeypatch.setattr(requests.Session, "request", request)


def test_patch_is_retried_on_a_revision_conflict(
    monkeypatch: pytest.MonkeyPatch, calls: list[Any]
) -> None:
    conflict = response(409, {"current_revision": 2})
    answer(monkeypatch, calls, conflict, response(200, {"phase": "progressing"}))
    got = bw.patch_release(FakeTarget(), {"weights": {"canary": 5}}, "why")  # type: ignore[arg-type]
    assert got == {"phase": "progressing"}
    assert [c[2]["json"]["expected_revision"] for c in calls] == [1, 2]
    method, url, kwargs = calls[0]
    assert (method, url) == ("PATCH", f"{BROKER}/v1/releases/default")
    assert kwargs["json"]["reason"] == "why" and kwargs["headers"] == {"Authorization": "Bearer op"}


def test_a_refused_patch_names_the_change_and_the_brokers_message(
    monkeypatch: pytest.MonkeyPatch, calls: list[Any]
) -> None:
    answer(monkeypatch, calls, response(422, {"error": {"message": "weight too high"}}))
    with pytest.raises(RolloutError, match=r"refused .*'default'.*HTTP 422: weight too high"):
        bw.patch_release(FakeTarget(), {"weights": {"canary": 500}}, "why")  # type: ignore[arg-type]


def test_a_release_that_keeps_changing_gives_up(
    monkeypatch: pytest.MonkeyPatch, calls: list[Any]
) -> None:
    conflicts = [response(409, {"current_revision": i}) for i in range(bw.CAS_TRIES)]
    answer(monkeypatch, calls, *conflicts)
    with pytest.raises(RolloutError, match="kept changing under the harness"):
        bw.patch_release(FakeTarget(), {"weights": {"canary": 5}}, "why")  # type: ignore[arg-type]
    assert len(calls) == bw.CAS_TRIES


def test_an_unreachable_broker_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> requests.Response:
        raise requests.ConnectionError("refused")

    monkeypatch.setattr(requests.Session, "request", refuse)
    with pytest.raises(
        RolloutError, match=r"cannot reach the broker \(http://broker.test/v1/versions\)"
    ):
        bw.register_version(FakeTarget(), "v3", {"model": "m"})  # type: ignore[arg-type]


def test_a_refused_registration_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    answer(monkeypatch, made, response(409, {"error": {"message": "exists"}}))
    with pytest.raises(RolloutError, match="registering version v3: HTTP 409: exists"):
        bw.register_version(FakeTarget(), "v3", {"model": "m"})  # type: ignore[arg-type]
    assert made[0][2]["json"]["digest"] == manifest_digest({"model": "m"})


def test_a_fresh_name_drops_the_old_stamp_and_skips_known_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    class Api:
        def version_known(self, name: str) -> bool:
            seen.append(name)
            return len(seen) == 1

    monkeypatch.setattr(bw, "over_api", lambda target, read, **kw: read(Api()))
    free = bw.unused_version(FakeTarget(), "v2-g1700000000000")  # type: ignore[arg-type]
    assert free == seen[1] and free.startswith("v2-g") and free.count("-g") == 1


def test_a_broker_that_cannot_say_is_a_rollout_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(target: Any, read: Any, **kw: Any) -> Any:
        raise ApiError("the broker answered HTTP 503", f"{BROKER}/v1/releases/default", 503)

    monkeypatch.setattr(bw, "over_api", fail)
    with pytest.raises(RolloutError, match="HTTP 503"):
        bw.target_broker(FakeTarget()).release()  # type: ignore[arg-type]


class Recording(requests.Session):
    """A session that answers from a queue and keeps what was asked."""

    def __init__(self, *answers: requests.Response) -> None:
        super().__init__()
        self.answers = list(answers)
        self.made: list[tuple[str, str, Any]] = []

    def request(self, method: str | bytes, url: str | bytes, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.made.append((str(method), str(url), kwargs))
        return self.answers.pop(0)


def test_a_session_handed_in_carries_every_read_and_write(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_other(*args: Any, **kwargs: Any) -> requests.Response:
        raise AssertionError("a request outside the session handed in")

    monkeypatch.setattr(requests.Session, "request", no_other)
    session = Recording(response(200, {"revision": 4}), response(200, {"phase": "progressing"}))
    broker = bw.target_broker(FakeTarget(), session=session)  # type: ignore[arg-type]
    assert broker.patch({"weights": {"canary": 5}}, "why") == {"phase": "progressing"}
    (get, read_url, _), (patch, write_url, write) = session.made
    assert (get, read_url) == ("GET", f"{BROKER}/v1/releases/default")
    assert (patch, write_url) == ("PATCH", f"{BROKER}/v1/releases/default")
    assert write["json"]["expected_revision"] == 4 and write["timeout"] == 5.0
