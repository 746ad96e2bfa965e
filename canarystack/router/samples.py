"""Samples for the gate: a bounded queue and a batch pusher.

This module must never block or slow a user request: ``put`` is O(1) and never awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable

import aiohttp

from canary_contract import strictjson
from canarystack.common.logs import get_logger
from canarystack.router.records import OutcomeRecord, SampleRecord

FLUSH_INTERVAL_S = 0.2
# A comparison wakes the pusher: it goes to the gate within this long (what comes in the
# meantime rides along), not at the next FLUSH_INTERVAL_S tick. Outcomes wait for the tick.
COMPARISON_FLUSH_S = 0.05
MAX_BATCH = 500
PUSH_TIMEOUT_S = 2.0
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 2.0

_log = get_logger("router")


class SampleQueue:
    """Bounded FIFO of ``(kind, record)``; ``kind`` is "comparison" or "outcome"."""

    def __init__(self, maxsize: int, on_drop: Callable[[str], None] | None = None) -> None:
        self.maxsize = maxsize
        self.items: deque[tuple[str, SampleRecord]] = deque()
        self.dropped_total = 0
        self.dropped_unreported = 0
        self._on_drop = on_drop
        self.wakeup = asyncio.Event()

    def put(self, kind: str, record: SampleRecord) -> bool:
        if len(self.items) >= self.maxsize:
            self.dropped_total += 1
            self.dropped_unreported += 1
            if self._on_drop is not None:
                self._on_drop(kind)
            return False
        self.items.append((kind, record))
        if kind == "comparison" or len(self.items) >= MAX_BATCH:
            self.wakeup.set()
        return True

    def take(self, n: int) -> list[tuple[str, SampleRecord]]:
        out: list[tuple[str, SampleRecord]] = []
        items = self.items
        while items and len(out) < n:
            out.append(items.popleft())
        return out

    def __len__(self) -> int:
        return len(self.items)


class GatePusher:
    """Background task that drains a ``SampleQueue`` into the gate.

    Comparisons (shadow.py) and per-request outcomes are put on a bounded in-memory queue;
    one background task sends them in batches to ``POST {gate}/v1/samples`` (admin token)
    as ``{"router_id", "release", "batch_id", "comparisons": [...], "outcomes": [...],
    "dropped": N}`` (docs/ARCHITECTURE.md §3), where ``dropped`` counts records dropped since
    the last batch the gate accepted and ``batch_id`` is fresh per batch and the *same* when
    that batch is resent, so the gate can count a retried batch once.

    A full queue drops the new record and counts it. A failed push (no connection, timeout,
    5xx) keeps its batch and tries again after a short backoff, while new records keep
    filling (and, if the gate stays away, overflowing) the bounded queue, so memory stays
    bounded. 401/403 mean the gate refused the router's credential, not the batch: the batch
    is kept and retried the same way, and the refusal is reported (``auth``, a metric, a log
    line) — a router whose samples cannot reach the gate must never look fine. Any other 4xx
    means the batch itself is bad (docs/ARCHITECTURE.md §4): it is logged, counted and
    dropped, never resent. Batches are written with ``strictjson`` (no ``NaN`` ever leaves).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        gate_url: str,
        queue: SampleQueue,
        *,
        router_id: str,
        release: str,
        admin_token: str | None,
        on_push: Callable[[str], None] | None = None,
        on_auth_error: Callable[[int], None] | None = None,
        on_drop: Callable[[str], None] | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        wrong_credential: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # admin_token: the samples credential (--gate-token-file, else the admin token).
        # wrong_credential: while it says True (the router's wrong_gate_credential fault,
        # a botched secret rotation), batches go out with a credential the gate refuses.
        self.session = session
        self.url = gate_url.rstrip("/") + "/v1/samples"
        self.queue = queue
        self.router_id = router_id
        self.release = release
        self.headers = {"content-type": "application/json"}
        if admin_token:
            self.headers["Authorization"] = f"Bearer {admin_token}"
        self.wrong_credential = wrong_credential or (lambda: False)
        self._wrong_headers = {
            **self.headers,
            "Authorization": f"Bearer wrong-gate-credential-{secrets.token_urlsafe(16)}",
        }
        self.on_push = on_push or (lambda result: None)
        self.on_auth_error = on_auth_error or (lambda status: None)
        self.on_drop = on_drop or (lambda kind: None)
        self.flush_interval_s = flush_interval_s
        self.pending: list[tuple[str, SampleRecord]] = []
        self.pending_id = ""
        self.pending_dropped = 0
        self.last_error: str | None = None
        self.auth = "ok"  # "ok" | "unauthorized" | "forbidden": the gate's last answer
        self.auth_error: str | None = None
        self.pushed_batches = 0
        # Since when (monotonic) samples wait that the gate has not accepted: set by the
        # first failed push (no connection, timeout, 5xx, 401/403), cleared by a success.
        self.failing_since: float | None = None
        # The last outage: how long it lasted and when it ended (monotonic), for the
        # dead-man switch's hold after the gate comes back.
        self.last_outage_s = 0.0
        self.recovered_at: float | None = None
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self, flush_timeout_s: float = 1.0) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # One last try so samples of the final moments are not lost on a clean stop.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.push_once(), flush_timeout_s)

    async def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while True:
            woken = False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.queue.wakeup.wait(), self.flush_interval_s)
                woken = True
            if woken and len(self.queue.items) < MAX_BATCH:
                await asyncio.sleep(min(COMPARISON_FLUSH_S, self.flush_interval_s))
            self.queue.wakeup.clear()
            ok = await self.push_once()
            if ok:
                backoff = BACKOFF_MIN_S
            else:
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def push_once(self) -> bool:
        """Send the pending batch (refilled from the queue); True on success or nothing to do."""
        if not self.pending:
            self.pending = self._finite(self.queue.take(MAX_BATCH))
            self.pending_id = uuid.uuid4().hex
            self.pending_dropped = self.queue.dropped_unreported
            self.queue.dropped_unreported = 0
        if not self.pending and not self.pending_dropped:
            return True
        comparisons = [r for k, r in self.pending if k == "comparison"]
        outcomes = [r for k, r in self.pending if k == "outcome"]
        body = {
            "router_id": self.router_id,
            "release": self.release,
            "batch_id": self.pending_id,
            "comparisons": comparisons,
            "outcomes": outcomes,
            "dropped": self.pending_dropped,
        }
        started = self.clock()
        try:
            async with self.session.post(
                self.url,
                data=strictjson.dumps_bytes(body),
                headers=self._wrong_headers if self.wrong_credential() else self.headers,
                timeout=aiohttp.ClientTimeout(total=PUSH_TIMEOUT_S),
            ) as resp:
                text = await resp.text()
                if resp.status in (401, 403):
                    self._refused(resp.status, text, started)
                    return False
                if 400 <= resp.status < 500:
                    _log.error(
                        "gate_rejected_batch",
                        url=self.url,
                        status=resp.status,
                        answer=text[:300],
                        comparisons=len(comparisons),
                        outcomes=len(outcomes),
                    )
                    self.pending = []
                    self.pending_dropped = 0
                    self.on_push("rejected")
                    return True
                if resp.status >= 300:
                    raise RuntimeError(f"gate answered {resp.status}: {text[:200]}")
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc or f'no answer within {PUSH_TIMEOUT_S:g} s'}"
            if error != self.last_error:  # log changes, not every retry
                _log.warning("gate_push_failed", url=self.url, error=error, batch=len(self.pending))
            self.last_error = error
            self._failed(started)
            self.on_push("error")
            return False
        if self.last_error is not None:
            _log.info("gate_push_recovered", url=self.url)
        self.last_error = None
        if self.failing_since is not None:
            self.recovered_at = self.clock()
            self.last_outage_s = self.recovered_at - self.failing_since
        self.failing_since = None
        self.auth = "ok"
        self.pending = []
        self.pending_dropped = 0
        self.pushed_batches += 1
        self.on_push("ok")
        return True

    def _failed(self, started: float) -> None:
        """A push begun at ``started`` (monotonic) failed: the gate has not accepted the
        samples since then, at the latest."""
        if self.failing_since is None:
            self.failing_since = started

    def unaccepted_s(self) -> float:
        """Seconds the gate has not accepted the samples that wait (0 while it does)."""
        if self.failing_since is None:
            return 0.0
        return self.clock() - self.failing_since

    def accepting_s(self) -> float | None:
        """Seconds since the gate accepted samples again after its last outage (None:
        no outage ended yet, or one is going on)."""
        if self.failing_since is not None or self.recovered_at is None:
            return None
        return self.clock() - self.recovered_at

    def _finite(self, items: list[tuple[str, SampleRecord]]) -> list[tuple[str, SampleRecord]]:
        """Drop (and count) any record strict JSON cannot write: it must never stall the
        whole queue, and a non-finite value must never reach the gate."""
        try:
            strictjson.dumps([r for _, r in items])
            return items
        except ValueError:
            pass
        kept: list[tuple[str, SampleRecord]] = []
        for kind, record in items:
            try:
                strictjson.dumps(record)
            except ValueError:
                _log.error("sample_not_finite", kind=kind, record=repr(record)[:300])
                self.queue.dropped_total += 1
                self.queue.dropped_unreported += 1
                self.on_drop(kind)
                continue
            kept.append((kind, record))
        return kept

    def _refused(self, status: int, text: str, started: float) -> None:
        """401/403: the gate refused the credential. Keep the batch; report; retry."""
        auth = "unauthorized" if status == 401 else "forbidden"
        error = f"gate answered {status}: {text[:200]}"
        if auth != self.auth:
            _log.error(
                "gate_auth_refused",
                url=self.url,
                status=status,
                answer=text[:300],
                batch=len(self.pending),
                effect="batch kept and retried; check the router's samples credential "
                "(--gate-token-file)",
            )
        self.auth = auth
        self.auth_error = error
        self.last_error = error
        self._failed(started)
        self.on_auth_error(status)
        self.on_push("auth_error")


def outcome_record(
    *,
    variant: str,
    bucket: str,
    prompt_tokens: int,
    ttft_s: float | None,
    error: str | None,
    request_id: str,
) -> OutcomeRecord:
    return {
        "time": time.time(),
        "variant": variant,
        "bucket": bucket,
        "prompt_tokens": prompt_tokens,
        "ttft_s": ttft_s,
        "error": error,
        "request_id": request_id,
    }
