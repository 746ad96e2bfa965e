"""``StackApi``: the one HTTP client the harness uses for the stack's own APIs.

This module must never create or close the session it is given, write to the broker,
or import ``canarystack``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import requests

from canary_contract.json import JsonObject
from gameday.observers import GateObserver
from gameday.observers.broker import BrokerObserver
from gameday.oracle.wire import loads
from gameday.stackhttp import STATE_TIMEOUT_S, ApiError, JsonHttp, error_text
from gameday.targets import Target
from gameday.targets.history import HISTORY_TIMEOUT_S

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
    "error_text",
]

# The harness's HTTP timeouts, one per kind of call (StackApi's docstring says which):
# STATE_TIMEOUT_S (3.0): a read of current state, also a fault's injection and clearing on a
# component's admin API; defined in gameday.stackhttp, the transport the observers share
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


class StackApi(JsonHttp):
    """The stack's APIs of one target, over ``session``: its gate (through the target's
    gate observer, ``gameday.observers``: canarystack's broker and gate API, or a foreign
    gate's parts) and any replica's own API.

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
        super().__init__(session)
        self.target = target
        self._gate: GateObserver | None = None

    # --- the gate, through its observer ---------------------------------------------------
    def gate(self) -> GateObserver:
        """The target's gate observer: the one its file describes, else canarystack's
        (``BrokerObserver``: its broker and gate API)."""
        if self._gate is None:
            self._gate = self.target.observer() or BrokerObserver(self.target)
        return self._gate

    def release(self) -> Mapping[str, object]:
        """The release as the gate's record has it (canarystack: the broker's)."""
        return self.gate().release(self.session, self.target.release)

    def events(self, after_seq: int = 0) -> Sequence[Mapping[str, object]]:
        """The release's whole event history after ``after_seq``, oldest first."""
        return self.gate().events(self.session, after_seq)

    def routers(self) -> Sequence[Mapping[str, object]]:
        """The entry points that report the weights they applied (canarystack's routers'
        heartbeats; none for a foreign gate, whose observer reads every weight itself)."""
        return self.gate().routers(self.session)

    def gate_state(self) -> Mapping[str, object]:
        """canarystack's gate API answer (its state and counters); ApiError 404 for a gate
        without one (``gate().gate_api``)."""
        return self.gate().gate_state(self.session)

    # --- the broker's version registry (canarystack only) ---------------------------------
    def broker_url(self) -> str:
        return self.target.service_url("broker")

    def version_known(self, version: str) -> bool:
        """Whether the broker knows ``version`` (any answer but HTTP 404)."""
        return self._get(f"{self.broker_url()}/v1/versions/{version}").status_code != 404

    # --- any replica ------------------------------------------------------------------
    def health_status(self, replica_url: str) -> int:
        """The HTTP status of a replica's ``/health``."""
        return self.get_status(f"{replica_url}/health")

    def get_status(self, url: str) -> int:
        """The HTTP status of a GET of ``url`` (a foreign part's own health URL)."""
        return self._get(url).status_code

    def health(self, replica_url: str) -> Mapping[str, object]:
        """A replica's ``/health`` body (a router's says whether the gate hears it)."""
        return self.get_json(f"{replica_url}/health")

    def faults(self, replica_url: str, headers: dict[str, str]) -> list[Mapping[str, object]]:
        """The faults a replica holds now (``GET /admin/faults``)."""
        body = self.get_json(f"{replica_url}/admin/faults", headers=headers)
        found = body.get("faults", [])
        return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []

    def colour_hop_pages(
        self, replica_url: str, headers: dict[str, str], limit: int = HOPS_PAGE_LIMIT
    ) -> list[Mapping[str, object]]:
        """Every page of a replica's colour hop log (``GET /v1/colour/hops``, ``headers``
        holding its admin credential), oldest first, up to the first page that brings no
        hop or no later ``next_after_seq`` (at most ``HOPS_MAX_PAGES``)."""
        url = f"{replica_url}{HOPS_PATH}"
        pages: list[Mapping[str, object]] = []
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
    def completion(self, body: Mapping[str, object], headers: dict[str, str]) -> requests.Response:
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
