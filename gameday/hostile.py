"""Hostile client input, as a careless or malicious client would send it to the router.

This module sends traffic only to the URL it is given (the target's router) and never
more than ``max_requests`` requests.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import requests

from gameday.api import REQUEST_TIMEOUT_S
from gameday.evidence.checks import FloodJson, ServerError

PIN_HEADER = "x-canary-variant"

MODEL = "canary-gameday"


@dataclass(frozen=True)
class HostileInput:
    """One hostile request: where it goes, its raw body and headers, and how often a flood
    may repeat it (big bodies are sent rarely, so the flood stays a few MB/s).

    Every input is a request the router must answer with a 4xx (or serve normally), never a
    5xx, never a stall, and never as canary evidence. ``CATALOGUE`` lists them; ``flood``
    sends them round-robin, pinned to a variant, at a bounded rate for a bounded time, and
    returns what came back per input. The catalogue is also what the tests post one by one.
    """

    name: str
    path: str
    body: bytes
    headers: dict[str, str | bytes] = field(default_factory=dict)
    max_sends: int | None = None


def _completion(prompt_json: str, extra: str = "") -> bytes:
    return (
        '{"model":"' + MODEL + '","prompt":' + prompt_json + ',"max_tokens":4' + extra + "}"
    ).encode()


def _catalogue() -> list[HostileInput]:
    chat = "/v1/chat/completions"
    comp = "/v1/completions"
    nested = "[" * 100_000 + "]" * 100_000
    return [
        HostileInput("lone-surrogate-prompt", comp, _completion('"hello \\ud800"')),
        HostileInput(
            "lone-surrogate-chat",
            chat,
            b'{"model":"' + MODEL.encode() + b'","max_tokens":4,'
            b'"messages":[{"role":"user","content":"hi \\udfff"}]}',
        ),
        HostileInput("nan-temperature", comp, _completion('"hi"', ',"temperature":NaN')),
        HostileInput("infinity-top-p", comp, _completion('"hi"', ',"top_p":Infinity')),
        HostileInput("huge-integer", comp, _completion('"hi"', ',"seed":' + "9" * 5000)),
        HostileInput("overflowing-float", comp, _completion('"hi"', ',"max_tokens":1e400')),
        HostileInput("deep-nesting", comp, _completion('"hi"', ',"user":' + nested)),
        HostileInput("not-json", comp, b'{"model": "x", "prompt": '),
        HostileInput("invalid-utf8", comp, b'{"model":"x","prompt":"\xff\xfe"}'),
        HostileInput("json-array", comp, b"[1, 2, 3]"),
        HostileInput("empty-body", comp, b""),
        HostileInput(
            "many-messages",
            chat,
            (
                '{"model":"'
                + MODEL
                + '","max_tokens":4,"messages":['
                + ",".join(['{"role":"user","content":"x"}'] * 20_000)
                + "]}"
            ).encode(),
            max_sends=5,
        ),
        HostileInput(
            "many-stop-strings",
            comp,
            _completion('"hi"', ',"stop":[' + ",".join(['"s"'] * 10_000) + "]"),
        ),
        HostileInput("huge-logprobs", comp, _completion('"hi"', ',"logprobs":1000000')),
        HostileInput(
            "oversized-body", comp, _completion('"' + "a" * (16 * 1024**2) + '"'), max_sends=3
        ),
        HostileInput(
            "undecodable-authorization",
            comp,
            _completion('"hi"'),
            headers={"Authorization": b"Bearer \xff\xfe\x00bad"},
        ),
        HostileInput("bad-pin-value", comp, _completion('"hi"'), headers={PIN_HEADER: "both"}),
        HostileInput(
            "wrong-content-type",
            comp,
            _completion('"hi"'),
            headers={"content-type": "text/plain; charset=klingon"},
        ),
    ]


CATALOGUE: tuple[HostileInput, ...] = tuple(_catalogue())


def send(
    session: requests.Session, router_url: str, item: HostileInput, pin: str | None
) -> tuple[int | None, str]:
    """One hostile request -> (status or None when the connection failed, detail)."""
    headers: dict[str, str | bytes] = {"content-type": "application/json"}
    if pin is not None:
        headers[PIN_HEADER] = pin
    headers.update(item.headers)
    try:
        resp = session.post(
            router_url + item.path, data=item.body, headers=headers, timeout=REQUEST_TIMEOUT_S
        )
    except requests.RequestException as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    return resp.status_code, resp.text[:200]


class HostileFlood(FloodJson):
    """``hostile.json`` (and ``flood_pinned_canary``'s answer): where the flood went
    (written first), then ``FloodJson``'s keys."""

    started_at: float
    router: str
    pin: str


@dataclass
class FloodResult:
    sent: int = 0
    by_input: dict[str, Counter[str]] = field(default_factory=dict)
    server_errors: list[ServerError] = field(default_factory=list)
    elapsed_s: float = 0.0

    def note(self, name: str, status: int | None, detail: str) -> None:
        self.sent += 1
        key = "connection_failed" if status is None else str(status)
        self.by_input.setdefault(name, Counter())[key] += 1
        if (status is None or status >= 500) and len(self.server_errors) < 50:
            self.server_errors.append({"input": name, "status": status, "detail": detail})

    def to_json(self) -> FloodJson:
        return {
            "sent": self.sent,
            "elapsed_s": round(self.elapsed_s, 3),
            "by_input": {k: dict(v) for k, v in sorted(self.by_input.items())},
            "server_errors": self.server_errors,
        }


def _schedule(items: tuple[HostileInput, ...], max_requests: int) -> Iterator[HostileInput]:
    sends: Counter[str] = Counter()
    n = 0
    while n < max_requests:
        progressed = False
        for item in items:
            if item.max_sends is not None and sends[item.name] >= item.max_sends:
                continue
            sends[item.name] += 1
            n += 1
            progressed = True
            yield item
            if n >= max_requests:
                return
        if not progressed:
            return


def flood(
    router_url: str,
    *,
    duration_s: float,
    rate_per_s: float,
    pin: str | None = "canary",
    max_requests: int = 5_000,
    workers: int = 4,
    items: tuple[HostileInput, ...] = CATALOGUE,
    clock: Callable[[], float] = time.monotonic,
) -> FloodResult:
    """Send the catalogue round-robin at ``rate_per_s`` for ``duration_s`` seconds (and at
    most ``max_requests``), from ``workers`` threads; returns the statuses per input."""
    if not (0 < duration_s <= 600) or not (0 < rate_per_s <= 500):
        raise ValueError(
            f"flood: duration_s {duration_s!r} must be in (0, 600] and rate_per_s "
            f"{rate_per_s!r} in (0, 500]"
        )
    result = FloodResult()
    lock = threading.Lock()
    schedule = _schedule(items, max_requests)
    t0 = clock()
    end = t0 + duration_s
    interval = 1.0 / rate_per_s
    next_slot = [t0]

    def take() -> HostileInput | None:
        with lock:
            now = clock()
            if now >= end:
                return None
            slot = next_slot[0]
            next_slot[0] = max(slot, now - 1.0) + interval
            item = next(schedule, None)
        wait = slot - now
        if wait > 0:
            time.sleep(min(wait, max(0.0, end - now)))
        return item

    def worker() -> None:
        with requests.Session() as session:
            while (item := take()) is not None:
                status, detail = send(session, router_url, item, pin)
                with lock:
                    result.note(item.name, status, detail)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, workers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=duration_s + REQUEST_TIMEOUT_S + 5.0)
    result.elapsed_s = clock() - t0
    return result
