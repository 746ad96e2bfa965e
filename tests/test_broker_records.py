"""``BrokerClient``'s typed reads (issue #13 item 3; ``get_release`` since #30): the same
answers as the broker's JSON, as the contract's frozen records (``canary_contract.broker``),
against a real broker; an answer that is not a record is ``BadBrokerAnswer`` naming the
field."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from canary_contract.broker import Release, TripTest
from canary_contract.phases import Phase
from canarystack.broker.client import BadBrokerAnswer, BrokerClient, BrokerNotFound
from tests.broker_support import broker_with_versions, not_a_broker, trip_evidence
from tests.procs import ADMIN_TOKEN, Spawner


def test_typed_reads_match_the_dict_answers(spawn: Spawner, tmp_path: Path) -> None:
    proc, api = broker_with_versions(spawn, tmp_path / "state")
    api.patch_ok("default", phase="tripped", trip=trip_evidence(bucket="4k+"))

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            client = BrokerClient(session, proc.url, ADMIN_TOKEN, actor="records-test")
            release = await client.get_release("default")
            assert isinstance(release, Release)
            assert release.to_wire() == await asyncio.to_thread(api.release, "default")
            assert release.phase is Phase.TRIPPED and release.canary_off
            assert release.trip is not None and release.trip.test is TripTest.DRIFT
            assert release.trip.bucket == "4k+" and release.canary_weight == 5.0
            assert [r.name for r in await client.release_records()] == ["default"]
            version = await client.version_record("v2")
            assert version.version == "v2" and not version.quarantined
            page = await client.events_page_record("default", 0, 1)
            assert [e.revision for e in page.events] == [1] and not page.last
            rest = await client.events_page_record("default", page.next_after_seq)
            assert [e.revision for e in rest.events] == [2] and rest.last
            await client.heartbeat("r1", "default", 2)
            routers = await client.router_records("default")
            assert [(r.router_id, r.applied_revision) for r in routers.routers] == [("r1", 2)]
            with pytest.raises(BrokerNotFound):
                await client.get_release("nope")

    asyncio.run(scenario())


def test_an_answer_that_is_not_a_release_is_a_bad_answer_naming_the_field(
    tmp_path: Path,
) -> None:
    with not_a_broker(tmp_path, '{"name": "default", "revision": 3}') as url:

        async def scenario() -> None:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(BadBrokerAnswer) as err:
                    await BrokerClient(session, url, actor="t").get_release("default")
                assert "Not a valid Release: field 'phase'" in err.value.message
                assert err.value.url == url + "/v1/releases/default"

        asyncio.run(scenario())
