"""``StackApi``: the one HTTP client the harness uses for the stack's own APIs.

This module must never create or close the session it is given, write to the broker,
or import ``canarystack``.
"""

from __future__ import annotations

from typing import Any

import requests

from canary_contract.json import JsonObject
from gameday.observers import GateObserver, history, release_now
from gameday.oracle.wire import loads
from gameday.targets import Target
from gameday.targets.history import HISTORY_TIMEOUT_S, HistoryError, read_events

__all__ = [
    "ANNOTATION_TIMEOUT_S",
    "BROKER_WRITE_TIMEOUT_S",
    "HISTORY_TIMEOUT_S",
    "HOPS_PATH",
    "POLL_TIMEOUT_S",
    "PROMETHEUS_RANGE_TIMEOUT_S",
    "PROMETHEUS_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "STATE_TIMEOUT_S",
    "ApiError",
    "PrometheusApi",
    "StackApi",
]

# The harness's HTTP timeouts, one per kind of call (StackApi's docstring says which):
STATE_TIMEOUT_S = 3.0  # also a fault's injection and clearing on a component's admin API
# HISTORY_TIMEOUT_S (5.0): one page of history; defined in gameday.targets.history, which
# gameday.api imports (so it cannot import gameday.api) and which reads the pages
REQUEST_TIMEOUT_S = 10.0
PROMETHEUS_TIMEOUT_S = 5.0  # also Prometheus's own list of scrape targets
# Kinds of call StackApi does not make (where the value differs, it is deliberate):
ANNOTATION_TIMEOUT_S = 2.0  # a best-effort note on the broker's timeline: never holds a fault up
BROKER_WRITE_TIMEOUT_S = 5.0  # an operator write (broker_writes): stored before it is answered
POLL_TIMEOUT_S = 1.0  # a quick look (a health tick, a readiness poll): slow counts as no answer
PROMETHEUS_RANGE_TIMEOUT_S = 10.0  # a range query of up to 10,000 points per series (report)
HOPS_PATH = "/v1/colour/hops"  # every component's colour hop log (admin credential)
HOPS_PAGE_LIMIT = 10_000
HOPS_MAX_PAGES = 50


class ApiError(RuntimeError):
    """A stack API could not answer; ``url`` is what was asked, ``status`` its HTTP
    status (0: no answer at all)."""

    def __init__(self, message: str, url: str, status: int = 0, cause: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.cause = cause  # the transport's exception class, when there was no answer


def error_text(resp: requests.Response) -> str:
    """A component's error message in ``resp`` (OpenAI-shaped ``error.message``), else the
    start of its body."""
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]


class StackApi:
    """The broker, router, gate and replica APIs of one target, over ``session``.

    The caller passes its ``requests.Session`` in (as ``canarystack/broker/client.py`` takes
    its ``aiohttp`` session), so it owns pooling and lifetime and tests aim it at real
    components::

        with requests.Session() as session:
            api = StackApi(session, target)
            release = api.release()
            events = api.events()          # every page of the history

    Timeouts are one policy, a constant per kind of call (each request gets its own):

    - ``STATE_TIMEOUT_S``: a read of current state (release, routers, health, gate, faults,
      metrics) — small answers from a component that is up;
    - ``HISTORY_TIMEOUT_S``: one page of a release's event history (up to 10,000 events), or
      of a component's colour hop log;
    - ``REQUEST_TIMEOUT_S``: a request a user could send (a completion through the router);
    - ``PROMETHEUS_TIMEOUT_S``: one PromQL query (``PrometheusApi``, the metrics the stack's
      Prometheus scraped).

    Every failure is an ``ApiError`` naming the URL, what went wrong and, where a person can
    act, what to do; ``status`` is the HTTP status (0: no answer). Answers are read with the
    harness's strict JSON (``gameday.oracle.wire``).
    """

    def __init__(self, session: requests.Session, target: Target) -> None:
        self.session = session
        self.target = target

    # --- the transport ----------------------------------------------------------------
    def _get(
        self,
        url: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = STATE_TIMEOUT_S,
    ) -> requests.Response:
        try:
            return self.session.get(url, params=params, headers=headers, timeout=timeout_s)
        except requests.RequestException as exc:
            raise ApiError(
                f"cannot reach {url}: {exc.__class__.__name__} (is the component up, and "
                "does the target file point at it?)",
                url,
                cause=exc.__class__.__name__,
            ) from None

    def _json(self, url: str, resp: requests.Response) -> Any:
        try:
            return loads(resp.content)
        except ValueError as exc:
            raise ApiError(
                f"{url} answered HTTP {resp.status_code} with no valid JSON: {exc}", url
            ) from None

    def get_json(
        self,
        url: str,
        *,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> JsonObject:
        """A JSON object from ``url`` (HTTP 200 only)."""
        return self._object(url, self._get(url, params=params, headers=headers))

    def _object(self, url: str, resp: requests.Response) -> JsonObject:
        if resp.status_code != 200:
            raise ApiError(f"{url} answered HTTP {resp.status_code}", url, resp.status_code)
        body = self._json(url, resp)
        if not isinstance(body, dict):
            raise ApiError(f"{url} did not answer a JSON object", url, resp.status_code)
        return body

    # --- the broker ---------------------------------------------------------------------
    def broker_url(self) -> str:
        return self.target.service_url("broker")

    def _no_release(self, url: str) -> ApiError:
        return ApiError(
            f"release {self.target.release!r} does not exist on the broker ({url}); "
            "check 'release' in the target file",
            url,
            404,
        )

    # --- a foreign gate (kind: external): read through its observer ---------------------
    def observed(self) -> GateObserver | None:
        """The gate observer of a target whose gate is not canarystack's (None: ours)."""
        observer = getattr(self.target, "observer", None)
        return observer() if callable(observer) else None

    def _observed_release(self, observer: GateObserver) -> JsonObject:
        snap = observer.snapshot(self.session)
        return release_now(observer.log.snapshots(), snap, self.target.release)

    def release(self) -> JsonObject:
        """The release as the broker has it (a foreign gate: as its observer sees it,
        ``gameday.observers.release_now``)."""
        observer = self.observed()
        if observer is not None:
            return self._observed_release(observer)
        url = f"{self.broker_url()}/v1/releases/{self.target.release}"
        try:
            return self.get_json(url)
        except ApiError as exc:
            if exc.status == 404:
                raise self._no_release(url) from None
            raise

    def events(self, after_seq: int = 0) -> list[JsonObject]:
        """The release's whole event history after ``after_seq``, oldest first: every
        page (a long-lived broker holds more than one, and the first is the oldest). A
        foreign gate's history is what its observer saw (``gameday.observers.history``)."""
        observer = self.observed()
        if observer is not None:
            observer.snapshot(self.session)
            return [
                e
                for e in history(observer.log.snapshots(), observer.name)
                if int(e["seq"]) > after_seq
            ]
        broker = self.broker_url()
        url = f"{broker}/v1/releases/{self.target.release}/events"
        try:
            return read_events(
                broker,
                self.target.release,
                after_seq=after_seq,
                timeout_s=HISTORY_TIMEOUT_S,
                session=self.session,
            )
        except HistoryError as exc:
            if exc.status == 404:
                raise self._no_release(url) from None
            raise ApiError(f"reading the release's history: {exc}", url, exc.status) from None

    def version_known(self, version: str) -> bool:
        """Whether the broker knows ``version`` (any answer but HTTP 404)."""
        return self._get(f"{self.broker_url()}/v1/versions/{version}").status_code != 404

    def routers(self) -> list[JsonObject]:
        """The live routers the broker knows for the release (their heartbeats); none for
        a foreign gate (its observer reads every entry point's weight itself)."""
        if self.observed() is not None:
            return []
        url = f"{self.broker_url()}/v1/routers"
        body = self.get_json(url, params={"release": self.target.release})
        routers = body.get("routers")
        return [r for r in routers if isinstance(r, dict)] if isinstance(routers, list) else []

    # --- the gate -----------------------------------------------------------------------
    def gate_url(self) -> str:
        return f"{self.target.service_url('gate')}/v1/gate/{self.target.release}"

    def gate_state(self) -> JsonObject:
        """The gate's state and counters for the release (canarystack's gate API only)."""
        if self.observed() is not None:
            raise ApiError(
                f"not applicable: target {self.target.name!r} has no canarystack gate API "
                "(its gate is read through an observer)",
                self.target.name,
                404,
            )
        return self.get_json(self.gate_url())

    # --- any replica ------------------------------------------------------------------
    def health_status(self, replica_url: str) -> int:
        """The HTTP status of a replica's ``/health``."""
        return self.get_status(f"{replica_url}/health")

    def get_status(self, url: str) -> int:
        """The HTTP status of a GET of ``url`` (a foreign part's own health URL)."""
        return self._get(url).status_code

    def health(self, replica_url: str) -> JsonObject:
        """A replica's ``/health`` body (a router's says whether the gate hears it)."""
        return self.get_json(f"{replica_url}/health")

    def faults(self, replica_url: str, headers: dict[str, str]) -> list[JsonObject]:
        """The faults a replica holds now (``GET /admin/faults``)."""
        body = self.get_json(f"{replica_url}/admin/faults", headers=headers)
        found = body.get("faults", [])
        return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []

    def colour_hop_pages(
        self, replica_url: str, headers: dict[str, str], limit: int = HOPS_PAGE_LIMIT
    ) -> list[JsonObject]:
        """Every page of a replica's colour hop log (``GET /v1/colour/hops``, ``headers``
        holding its admin credential), oldest first, up to the first page that brings no
        hop or no later ``next_after_seq`` (at most ``HOPS_MAX_PAGES``)."""
        url = f"{replica_url}{HOPS_PATH}"
        pages: list[JsonObject] = []
        after = 0
        for _ in range(HOPS_MAX_PAGES):
            params = {"after_seq": str(after), "limit": str(limit)}
            resp = self._get(url, params=params, headers=headers, timeout_s=HISTORY_TIMEOUT_S)
            page = self._object(url, resp)
            hops = page.get("hops")
            if not isinstance(hops, list):
                raise ApiError(f"{url}: the answer has no 'hops' list", url, 200)
            pages.append(page)
            nxt = page.get("next_after_seq")
            got = any(isinstance(h, dict) for h in hops)
            if not got or not isinstance(nxt, int) or nxt <= after:
                break
            after = nxt
        return pages

    def metrics_text(self, replica_url: str) -> str:
        """A replica's Prometheus exposition (``/metrics``)."""
        url = f"{replica_url}/metrics"
        resp = self._get(url)
        if resp.status_code != 200:
            raise ApiError(f"{url} answered HTTP {resp.status_code}", url, resp.status_code)
        return resp.text

    # --- the router, as a user ----------------------------------------------------------
    def completion(self, body: JsonObject, headers: dict[str, str]) -> requests.Response:
        """``POST /v1/completions`` through the router; any answer comes back as it is."""
        url = f"{self.target.service_url('router')}/v1/completions"
        try:
            return self.session.post(url, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as exc:
            name = exc.__class__.__name__
            raise ApiError(f"cannot reach {url}: {name}", url, cause=name) from None


class PrometheusApi:
    """The HTTP API of a Prometheus (``url`` without ``/api/v1``), over ``session``."""

    def __init__(self, session: requests.Session, url: str) -> None:
        self.session = session
        self.url = url.rstrip("/")

    def _data(self, path: str, expr: str, params: dict[str, str]) -> JsonObject:
        endpoint = f"{self.url}{path}"
        try:
            resp = self.session.post(
                endpoint, data={"query": expr, **params}, timeout=PROMETHEUS_TIMEOUT_S
            )
        except requests.RequestException as exc:
            name = exc.__class__.__name__
            raise ApiError(
                f"cannot reach Prometheus at {endpoint}: {name}", endpoint, 0, name
            ) from None
        try:
            body = loads(resp.content)
        except ValueError:
            raise ApiError(
                f"Prometheus at {endpoint} answered HTTP {resp.status_code} with no JSON",
                endpoint,
                resp.status_code,
            ) from None
        body = body if isinstance(body, dict) else {}
        if resp.status_code != 200 or body.get("status") != "success":
            raise ApiError(
                f"Prometheus refused the query {expr!r}: HTTP {resp.status_code} "
                f"{body.get('errorType', '')}: {body.get('error', '')}".rstrip(),
                endpoint,
                resp.status_code,
            )
        data = body.get("data")
        return data if isinstance(data, dict) else {}

    def query(self, expr: str, at: float | None = None) -> JsonObject:
        """``/api/v1/query``'s ``data`` (``resultType`` and ``result``) at ``at``."""
        return self._data("/api/v1/query", expr, {} if at is None else {"time": f"{at:.3f}"})

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> JsonObject:
        """``/api/v1/query_range``'s ``data`` over ``start``..``end`` every ``step_s``."""
        params = {"start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        return self._data("/api/v1/query_range", expr, params)
