"""Reading a release's whole event history from a broker, page by page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, Unpack

import requests

from canary_contract.broker import Event
from canary_contract.errors import ContractError
from gameday.errors import GamedayError
from gameday.oracle.wire import loads
from gameday.sessions import given_or_own

MAX_PAGE = 10_000  # the broker's largest page
MAX_PAGES = 1_000  # 10 million events: far beyond any release's history
HISTORY_TIMEOUT_S = 5.0  # one page (up to MAX_PAGE events); gameday.api names it with the others


class HistoryError(GamedayError, RuntimeError):
    """The history could not be read whole; ``status`` is the HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _page(
    session: requests.Session, url: str, after_seq: int, limit: int, timeout_s: float
) -> tuple[list[object], int | None]:
    params = {"after_seq": str(after_seq), "limit": str(limit)}
    try:
        resp = session.get(url, params=params, timeout=timeout_s)
    except requests.RequestException as exc:
        raise HistoryError(f"cannot reach the broker ({url}): {exc.__class__.__name__}") from None
    if resp.status_code != 200:
        raise HistoryError(
            f"the broker answered HTTP {resp.status_code} for {url}?after_seq={after_seq}",
            resp.status_code,
        )
    try:
        body = loads(resp.content)
    except ValueError as exc:
        raise HistoryError(f"the broker's answer for {url} is not valid JSON: {exc}") from None
    events = body.get("events") if isinstance(body, dict) else None
    if not isinstance(events, list):
        raise HistoryError(f"the broker's answer for {url} has no 'events' list")
    nxt = body.get("next_after_seq")
    return events, nxt if isinstance(nxt, int) and not isinstance(nxt, bool) else None


def read_events(
    broker_url: str,
    release: str,
    after_seq: int = 0,
    limit: int = MAX_PAGE,
    timeout_s: float = HISTORY_TIMEOUT_S,
    max_pages: int = MAX_PAGES,
    session: requests.Session | None = None,
) -> list[Mapping[str, object]]:
    """Every event of ``release`` after ``after_seq``, oldest first (all pages).

    Raises HistoryError when a page cannot be read, or when the history does not end
    within ``max_pages`` pages of ``limit`` events.

    ``GET /v1/releases/{name}/events?after_seq=N&limit=L`` answers at most ``L`` events (at
    most ``MAX_PAGE``), oldest first after ``N``. One request is not the history: on a
    long-lived broker it is the *oldest* page only. ``read_events`` repeats with ``after_seq``
    = the last ``seq`` returned (the answer's ``next_after_seq`` when it has one) until a page
    has fewer than ``limit`` events. Every harness reader of the history uses it;
    ``read_event_records`` gives the same events as the contract's ``Event`` records.

    Bounded: at most ``max_pages`` pages, each with its own timeout; a broker whose pages do
    not move forward is an error, never an endless loop. HTTP only (the harness never imports
    ``canarystack``); JSON read strictly (``gameday.oracle.wire``). Over ``session`` when
    given (``StackApi`` hands its own in), else over a short-lived session of its own.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit is {limit}: give 1 to {MAX_PAGE} events per page")
    url = f"{broker_url.rstrip('/')}/v1/releases/{release}/events"
    with given_or_own(session) as http:
        out: list[Mapping[str, object]] = []
        cursor = after_seq
        for _ in range(max_pages):
            page, nxt = _page(http, url, cursor, limit, timeout_s)
            out.extend(e for e in page if isinstance(e, dict))
            if len(page) < limit:
                return out
            last = page[-1].get("seq") if isinstance(page[-1], dict) else None
            following = nxt if nxt is not None else last
            if not isinstance(following, int) or following <= cursor:
                raise HistoryError(
                    f"the broker's history of {release!r} does not move forward after seq "
                    f"{cursor} (next {following!r}); is the broker a compatible version?"
                )
            cursor = following
        raise HistoryError(
            f"the history of {release!r} did not end within {max_pages} pages of {limit} events"
        )


class Paging(TypedDict, total=False):
    """``read_events``'s optional parameters, for the readers built on it."""

    after_seq: int
    limit: int
    timeout_s: float
    max_pages: int
    session: requests.Session | None


def read_event_records(broker_url: str, release: str, **paging: Unpack[Paging]) -> list[Event]:
    """``read_events`` as the contract's ``Event`` records. An event that is not one (a
    broker of another version, a corrupted store) is a ``HistoryError`` naming its seq and
    field: a reader never judges a history it could only partly read."""
    raw = read_events(broker_url, release, **paging)
    out: list[Event] = []
    for i, item in enumerate(raw):
        try:
            out.append(Event.from_wire(item))
        except ContractError as exc:
            raise HistoryError(
                f"event {i} (seq {item.get('seq')!r}) of {release!r} from {broker_url}: {exc}"
            ) from None
    return out
