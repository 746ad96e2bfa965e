"""``BrokerClient.follow``: the one loop that keeps a release in view, as an iterator.

This module must never write to the broker.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from canary_contract.broker import Release
from canarystack.broker.client_errors import (
    BadBrokerAnswer,
    BrokerError,
    BrokerNotFound,
    BrokerRequestError,
    BrokerUnavailable,
)

# follow(): the first wait after an error, its cap (it doubles per error in a row), and
# the wait after a 404 (the release does not exist yet: an answer, not a failure).
FOLLOW_BACKOFF_S = 0.1
FOLLOW_MAX_BACKOFF_S = 2.0
FOLLOW_MISSING_RETRY_S = 1.0


class ReleaseReader(Protocol):
    """What the follower uses of ``BrokerClient`` (which defines ``follow`` on top of this
    module): a plain read and a long poll, each answering the contract's ``Release`` (an
    answer that is not one is ``BadBrokerAnswer``)."""

    async def get_release(self, name: str) -> Release: ...

    async def watch(self, name: str, after: int, timeout_s: float = 30.0) -> Release: ...


class FollowKind(enum.StrEnum):
    """What one step of ``BrokerClient.follow`` brought."""

    RELEASE = "release"  # the broker answered with the release
    NOT_FOUND = "not_found"  # 404: no such release (yet)
    UNAVAILABLE = "unavailable"  # down, slow, 5xx
    REFUSED = "refused"  # another 4xx (``error.status``, ``error.param``: e.g. 401, 403)
    BAD_ANSWER = "bad_answer"  # an answer that is not a release
    ERROR = "error"  # anything else (a bug): reported like the others, never the end


@dataclass(frozen=True)
class FollowEvent:
    kind: FollowKind
    release: Release | None = None  # the release (kind RELEASE), else None
    # The answer came from a long poll (a watch), not a plain read: only then does it say
    # that the watch itself works.
    long_poll: bool = False
    # The first answer since the start or since an error, or a revision other than the
    # previous answer's: something to act on.
    changed: bool = False
    error: Exception | None = None  # what went wrong (every kind but RELEASE)
    retry_in_s: float = 0.0  # how long the follower waits before its next read


class ReleaseFollower:
    """``BrokerClient.follow``'s iterator.

    A plain read first and after every error, then long polls past the revision it last
    yielded; every answer and every failure is a ``FollowEvent``, the failure classified
    once (``not_found``, ``unavailable``, ``refused``, ``bad_answer``, ``error``) with how
    long the follower waits before its next read (doubling backoff; a 404 waits
    ``missing_retry_s``). It never ends on its own; cancelling the task that iterates it
    ends it at once.
    """

    def __init__(
        self,
        client: ReleaseReader,
        name: str,
        timeout_s: float | Callable[[], float],
        *,
        backoff_s: float | None = None,
        max_backoff_s: float | None = None,
        missing_retry_s: float | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self._timeout_s = timeout_s
        self.backoff_s = FOLLOW_BACKOFF_S if backoff_s is None else backoff_s
        self.max_backoff_s = FOLLOW_MAX_BACKOFF_S if max_backoff_s is None else max_backoff_s
        self.missing_retry_s = (
            FOLLOW_MISSING_RETRY_S if missing_retry_s is None else missing_retry_s
        )
        self.after: int | None = None  # the revision the next long poll waits past; None: read
        self._backoff = self.backoff_s
        self._wait = 0.0  # before the next read

    @property
    def timeout_s(self) -> float:
        """The long poll's timeout, read before each watch (the caller may lower it)."""
        return self._timeout_s() if callable(self._timeout_s) else self._timeout_s

    def retry(self) -> None:
        """The caller could not handle the last release: read it again plainly, after the
        backoff (which doubles, as after any error)."""
        self.after = None
        self._wait = self._backoff
        self._backoff = min(self.max_backoff_s, self._backoff * 2)

    def __aiter__(self) -> ReleaseFollower:
        return self

    async def __anext__(self) -> FollowEvent:
        if self._wait > 0:
            wait, self._wait = self._wait, 0.0
            await asyncio.sleep(wait)
        previous, long_poll = self.after, self.after is not None
        try:
            if previous is None:
                release = await self.client.get_release(self.name)
            else:
                release = await self.client.watch(self.name, previous, self.timeout_s)
            revision = release.revision
        except BrokerNotFound as exc:
            self.after = None
            self._wait = self.missing_retry_s
            return FollowEvent(FollowKind.NOT_FOUND, error=exc, retry_in_s=self._wait)
        except BrokerError as exc:
            if isinstance(exc, BadBrokerAnswer):
                kind = FollowKind.BAD_ANSWER
            elif isinstance(exc, BrokerRequestError):
                kind = FollowKind.REFUSED
            elif isinstance(exc, BrokerUnavailable):
                kind = FollowKind.UNAVAILABLE
            else:  # RevisionConflict / IllegalTransition: not what a read answers
                kind = FollowKind.BAD_ANSWER
            self.retry()
            return FollowEvent(kind, error=exc, retry_in_s=self._wait)
        except Exception as exc:  # a bug: a follower must outlive it
            self.retry()
            return FollowEvent(FollowKind.ERROR, error=exc, retry_in_s=self._wait)
        self._backoff = self.backoff_s
        self.after = revision
        changed = previous is None or revision != previous
        return FollowEvent(FollowKind.RELEASE, release, long_poll=long_poll, changed=changed)
