"""``BrokerClient.follow``: the one loop that keeps a release in view (issue #13, item 3).

Against a real broker process (and, for an answer that is not a broker's, a plain file
server): what each step yields, the error classification, the backoff, the plain read
after an error, and cancellation. The gate's and the executor's watches built on it are
tested through their services (test_gate_hostile.py, test_rollback_hostile.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import pytest

from canarystack.broker import client as client_mod
from canarystack.broker.client import (
    BadBrokerAnswer,
    BrokerClient,
    BrokerNotFound,
    BrokerRequestError,
    BrokerUnavailable,
    FollowEvent,
    FollowKind,
    ReleaseFollower,
)
from tests.broker_support import broker_with_versions, not_a_broker
from tests.procs import ADMIN_TOKEN, Spawner, free_port


async def step(follower: ReleaseFollower) -> FollowEvent:
    return await asyncio.wait_for(anext(follower), 30)


def test_follow_reads_then_long_polls_and_says_what_changed(
    spawn: Spawner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, api = broker_with_versions(spawn, tmp_path / "state", release=None)
    monkeypatch.setattr(client_mod, "WATCH_GRACE_S", 0.5)

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            client = BrokerClient(session, proc.url, ADMIN_TOKEN, actor="follow-test")
            timeout = {"s": 0.2}
            follower = client.follow("default", lambda: timeout["s"], missing_retry_s=0.01)
            # Not created yet: a 404, then a plain read again once it exists.
            missing = await step(follower)
            assert missing.kind is FollowKind.NOT_FOUND and missing.release is None
            assert isinstance(missing.error, BrokerNotFound)
            assert missing.retry_in_s == 0.01
            await asyncio.to_thread(api.create, "default")
            first = await step(follower)
            for _ in range(100):  # 404s until the follower's next read sees it
                if first.kind is FollowKind.RELEASE:
                    break
                assert first.kind is FollowKind.NOT_FOUND
                first = await step(follower)
            assert first.kind is FollowKind.RELEASE
            assert first.release is not None and first.release.revision == 1
            assert (first.long_poll, first.changed) == (False, True)
            assert follower.after == 1
            # A long poll that times out: the same release, nothing changed.
            same = await step(follower)
            assert same.kind is FollowKind.RELEASE and same.release is not None
            assert (same.long_poll, same.changed, same.release.revision) == (True, False, 1)
            # A change while it waits.
            timeout["s"] = 20.0
            waiting = asyncio.create_task(step(follower))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(api.patch_ok, "default", weights={"canary": 30})
            changed = await waiting
            assert changed.release is not None and changed.release.revision == 2
            assert (changed.long_poll, changed.changed) == (True, True)

    asyncio.run(scenario())


def test_follow_classifies_errors_backs_off_and_reads_plainly_after_one(
    spawn: Spawner, tmp_path: Path
) -> None:
    proc, _ = broker_with_versions(spawn, tmp_path / "state", "--max-watch-s", "2")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            # Nothing listens: unavailable, the wait doubling up to its cap.
            down = BrokerClient(session, f"http://127.0.0.1:{free_port()}", actor="t")
            follower = down.follow("default", 1.0, backoff_s=0.01, max_backoff_s=0.04)
            waits = []
            for _ in range(4):
                event = await step(follower)
                assert event.kind is FollowKind.UNAVAILABLE
                assert isinstance(event.error, BrokerUnavailable)
                waits.append(event.retry_in_s)
            assert waits == [0.01, 0.02, 0.04, 0.04]

            # A long-poll timeout above the broker's --max-watch-s: refused (400, naming
            # timeout_s); the next read is a plain one, which works, and resets the backoff.
            timeout = {"s": 30.0}
            client = BrokerClient(session, proc.url, ADMIN_TOKEN, actor="t")
            follower = client.follow("default", lambda: timeout["s"], backoff_s=0.01)
            first = await step(follower)
            assert first.kind is FollowKind.RELEASE and not first.long_poll
            refused = await step(follower)
            assert refused.kind is FollowKind.REFUSED
            assert isinstance(refused.error, BrokerRequestError)
            assert (refused.error.status, refused.error.param) == (400, "timeout_s")
            assert refused.retry_in_s == 0.01 and follower.after is None
            timeout["s"] = 0.1  # the caller lowers it: read before the next poll
            again = await step(follower)
            assert again.kind is FollowKind.RELEASE
            assert (again.long_poll, again.changed) == (False, True)
            polled = await step(follower)
            assert polled.kind is FollowKind.RELEASE and polled.long_poll

            # The caller could not handle an answer: retry() makes the next read plain,
            # after the backoff.
            follower.retry()
            assert follower.after is None
            plain = await step(follower)
            assert plain.kind is FollowKind.RELEASE and not plain.long_poll and plain.changed

    asyncio.run(scenario())


def test_follow_says_bad_answer_when_broker_is_not_a_broker(tmp_path: Path) -> None:
    with not_a_broker(tmp_path, '{"name": "default"}') as url:

        async def scenario() -> None:
            async with aiohttp.ClientSession() as session:
                follower = BrokerClient(session, url, actor="t").follow("default", backoff_s=0.01)
                for _ in range(2):
                    event = await step(follower)
                    assert event.kind is FollowKind.BAD_ANSWER
                    assert isinstance(event.error, BadBrokerAnswer)
                    assert "no integer 'revision'" in event.error.message
                    assert url in event.error.message

        asyncio.run(scenario())


def test_a_follower_waiting_in_a_long_poll_is_cancelled_at_once(
    spawn: Spawner, tmp_path: Path
) -> None:
    proc, api = broker_with_versions(spawn, tmp_path / "state")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            client = BrokerClient(session, proc.url, ADMIN_TOKEN, actor="t")
            seen: list[FollowEvent] = []

            async def follow() -> None:
                async for event in client.follow("default", 50.0):
                    seen.append(event)

            task = asyncio.create_task(follow())
            # The plain read, then the long poll is under way (the broker counts it).
            for _ in range(500):
                if seen and await asyncio.to_thread(api.watchers) == 1:
                    break
                await asyncio.sleep(0.02)
            assert len(seen) == 1 and await asyncio.to_thread(api.watchers) == 1
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)  # never the 50 s of the poll
            assert task.cancelled()

    asyncio.run(scenario())
