"""``BrokerClient`` against a real broker process: every method, and the exception each
kind of failure raises."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from canary_contract.broker import Release
from canarystack.broker import client as client_mod
from tests.broker_support import Api, digest_of, start_broker, trip_record
from tests.procs import ADMIN_TOKEN, Spawner, free_port


def test_exception_hierarchy() -> None:
    for cls in (
        client_mod.BrokerUnavailable,
        client_mod.RevisionConflict,
        client_mod.IllegalTransition,
        client_mod.BrokerRequestError,
    ):
        assert issubclass(cls, client_mod.BrokerError)
    assert issubclass(client_mod.BrokerNotFound, client_mod.BrokerRequestError)


def test_client_against_a_real_broker(
    spawn: Spawner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = start_broker(spawn, tmp_path / "state", "--router-expiry-s", "5")
    monkeypatch.setattr(client_mod, "WATCH_GRACE_S", 0.5)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            broker = client_mod.BrokerClient(
                session, proc.url + "/", ADMIN_TOKEN, actor="client-test"
            )

            # versions
            v1 = await broker.register_version("v1", {"image": "m:v1"})
            assert (
                v1.digest == digest_of({"image": "m:v1"}) == client_mod.manifest_digest(v1.manifest)
            )
            await broker.register_version("v2", "a string manifest")
            await broker.register_version("v3", {"image": "m:v3"})
            again = await broker.register_version("v1", {"image": "m:v1"})
            assert again == v1
            with pytest.raises(client_mod.BrokerRequestError) as bad_digest:
                await broker.register_version("v4", {"x": 1}, digest=digest_of({"x": 2}))
            assert bad_digest.value.status == 422
            assert bad_digest.value.code == "digest_mismatch"
            assert digest_of({"x": 2}) in bad_digest.value.message
            assert [v.version for v in await broker.list_versions()] == ["v1", "v2", "v3"]
            assert (await broker.version_record("v2")).manifest == "a string manifest"

            # releases
            created = await broker.create_release("default", "v1", "v2", 5, reason="start")
            assert (created.revision, created.weights.canary) == (1, 5)
            got = await broker.get_release("default")
            assert isinstance(got, Release) and got == created
            assert [r.name for r in await broker.release_records()] == ["default"]
            with pytest.raises(client_mod.BrokerNotFound) as missing:
                await broker.get_release("nope")
            assert missing.value.status == 404 and "nope" in missing.value.message

            # watch: the timeout path, then a change while waiting
            same = await broker.watch("default", after=1, timeout_s=0.2)
            assert same.revision == 1
            waiting = asyncio.create_task(broker.watch("default", after=1, timeout_s=20))
            await asyncio.sleep(0.05)
            patched = await broker.patch_release("default", 1, canary_weight=20, reason="more")
            changed = await asyncio.wait_for(waiting, 15)
            assert changed.revision == patched.revision == 2
            assert changed.weights.canary == 20

            # compare-and-set and phase rules
            with pytest.raises(client_mod.RevisionConflict) as conflict:
                await broker.patch_release("default", 1, canary_weight=30)
            assert conflict.value.current_revision == 2
            with pytest.raises(client_mod.IllegalTransition) as illegal:
                await broker.patch_release("default", 2, phase="rolled_back")
            assert illegal.value.current_phase == "progressing"
            assert illegal.value.allowed == ["promoted", "rolling_back", "tripped"]
            with pytest.raises(client_mod.BrokerRequestError) as bad:
                await broker.patch_release("default", 2, canary_weight=150)
            assert bad.value.status == 400 and bad.value.param == "weights.canary"
            tripped = await broker.patch_release(
                "default", 2, phase="tripped", trip=trip_record(), reason="gate"
            )
            assert tripped.trip is not None and tripped.trip.test == "drift"
            rb = await broker.patch_release("default", 3, phase="rolling_back", canary_weight=0)
            q = await broker.quarantine_version("v2", reason="drift")
            assert q.quarantined is True
            release = await broker.get_release("default")
            assert release.revision == rb.revision + 1
            assert release.canary is not None and release.canary.quarantined is True
            done = await broker.patch_release("default", release.revision, phase="rolled_back")
            back = await broker.patch_release(
                "default", done.revision, phase="progressing", canary="v3"
            )
            assert back.canary is not None and back.canary.version == "v3"
            assert back.weights.canary == 0
            no_canary = await broker.patch_release("default", back.revision, canary=None)
            assert no_canary.canary is None

            # events and annotations
            note = await broker.annotate(
                "default", {"annotation": "fault_injected", "kind": "latency"}, reason="test"
            )
            assert note.actor == "client-test"
            assert note.revision == no_canary.revision
            events = await broker.events("default")
            assert events[-1] == note
            assert [e.actor for e in events] == ["client-test"] * len(events)
            assert await broker.events("default", after_seq=events[-2].seq) == [note]
            with pytest.raises(client_mod.BrokerRequestError) as no_note:
                await broker.annotate("default", {"kind": "latency"})
            assert no_note.value.status == 400

            # routers
            await broker.heartbeat(
                "router-0",
                "default",
                no_canary.revision,
                applied_at=1_700_000_001.5,
                canary_off_since=1_700_000_000.25,
            )
            await broker.heartbeat("router-1", "other", None)  # an older router's beat
            every = (await broker.router_records()).routers
            assert [r.router_id for r in every] == ["router-0", "router-1"]
            live = (await broker.router_records("default")).routers
            assert [
                (r.router_id, r.applied_revision, r.applied_at, r.canary_off_since) for r in live
            ] == [("router-0", no_canary.revision, 1_700_000_001.5, 1_700_000_000.25)]
            other = (await broker.router_records("other")).routers
            assert (other[0].applied_at, other[0].canary_off_since) == (None, None)

            # failures that are the broker's, not the caller's
            anonymous = client_mod.BrokerClient(session, proc.url, None, actor="nobody")
            assert (await anonymous.get_release("default")).name == "default"
            with pytest.raises(client_mod.BrokerRequestError) as unauthorized:
                await anonymous.annotate("default", {"annotation": "x"})
            assert unauthorized.value.status == 401

            admin = Api(proc.url)
            r = admin.write("POST", "/admin/faults", {"kind": "unavailable", "ttl_s": 30})
            assert r.status_code == 201
            with pytest.raises(client_mod.BrokerUnavailable, match="503"):
                await broker.get_release("default")
            admin.write("DELETE", "/admin/faults")
            r = admin.write("POST", "/admin/faults", {"kind": "drop_watch", "ttl_s": 30})
            assert r.status_code == 201
            with pytest.raises(client_mod.BrokerUnavailable, match="no answer within"):
                await broker.watch("default", after=no_canary.revision, timeout_s=0.2)
            admin.write("DELETE", "/admin/faults")

            nowhere = client_mod.BrokerClient(
                session, f"http://127.0.0.1:{free_port()}", ADMIN_TOKEN
            )
            with pytest.raises(client_mod.BrokerUnavailable) as refused:
                await nowhere.release_records()
            assert refused.value.method == "GET"
            assert refused.value.url.endswith("/v1/releases")

    asyncio.run(scenario())
