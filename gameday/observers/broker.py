"""canarystack's own gate, read the way every other gate is: ``BrokerObserver``.

canarystack's gate writes what it decides into the broker (a trip is a phase change with
its evidence, a rollback two more, each router's heartbeat says which revision it
applied), so this observer reads the broker's release, its history and its routers, and
the gate's own API (``GET /v1/gate/{release}``: its state, noise floor and counters). It
keeps the same snapshot every observer keeps (``GateSnapshot``), so ``gameday run`` can
sample it like a foreign gate.

It only reads: it never writes to the broker.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import requests

from canary_contract.gate import GateState
from canary_contract.phases import canary_share, is_canary_off
from gameday.observers.base import GateObserver, GateSnapshot, ObservationLog
from gameday.stackhttp import ApiError, JsonHttp
from gameday.targets.history import HISTORY_TIMEOUT_S, HistoryError, read_events

if TYPE_CHECKING:
    from gameday.targets.base import Target

__all__ = ["BrokerObserver", "gate_line"]


class BrokerObserver(GateObserver):
    """canarystack's gate, through its broker and its gate API (module docstring)."""

    name = "canarystack-gate"
    gate_api = True

    def __init__(self, target: Target, log: ObservationLog | None = None) -> None:
        self.target = target
        self.log = log if log is not None else ObservationLog(None)

    # --- the broker ---------------------------------------------------------------------
    def _broker(self) -> str:
        return self.target.service_url("broker")

    def _no_release(self, url: str) -> ApiError:
        return ApiError(
            f"release {self.target.release!r} does not exist on the broker ({url}); "
            "check 'release' in the target file",
            url,
            404,
        )

    def release(self, session: requests.Session, release: str) -> Mapping[str, object]:
        """The release as the broker has it."""
        url = f"{self._broker()}/v1/releases/{release}"
        try:
            return JsonHttp(session).get_json(url)
        except ApiError as exc:
            if exc.status == 404:
                raise self._no_release(url) from None
            raise

    def events(
        self, session: requests.Session, after_seq: int = 0
    ) -> Sequence[Mapping[str, object]]:
        """The release's whole event history after ``after_seq``, oldest first: every page
        (a long-lived broker holds more than one, and the first is the oldest)."""
        broker = self._broker()
        url = f"{broker}/v1/releases/{self.target.release}/events"
        try:
            return read_events(
                broker,
                self.target.release,
                after_seq=after_seq,
                timeout_s=HISTORY_TIMEOUT_S,
                session=session,
            )
        except HistoryError as exc:
            if exc.status == 404:
                raise self._no_release(url) from None
            raise ApiError(f"reading the release's history: {exc}", url, exc.status) from None

    def routers(self, session: requests.Session) -> Sequence[Mapping[str, object]]:
        """The live routers the broker knows for the release (their heartbeats)."""
        url = f"{self._broker()}/v1/routers"
        body = JsonHttp(session).get_json(url, params={"release": self.target.release})
        routers = body.get("routers")
        return [r for r in routers if isinstance(r, dict)] if isinstance(routers, list) else []

    # --- the gate -----------------------------------------------------------------------
    def gate_url(self) -> str:
        return f"{self.target.service_url('gate')}/v1/gate/{self.target.release}"

    def where(self) -> str:
        return self.gate_url()

    def gate_state(self, session: requests.Session) -> Mapping[str, object]:
        """The gate's state and counters for the release."""
        return JsonHttp(session).get_json(self.gate_url())

    def summary(self, session: requests.Session) -> str:
        try:
            return gate_line(self.gate_state(session))
        except ApiError as exc:
            return f"the gate's state is unknown ({exc})"

    # --- the snapshot every observer keeps ------------------------------------------------
    def read(self, session: requests.Session) -> GateSnapshot:
        """The broker's phase and weight (the trip is the phase leaving ``progressing`` for
        a canary-off one; the weight is 0 in a canary-off phase whatever the weights say)
        and whether the gate can see (not ``inconclusive``)."""
        snap = GateSnapshot(
            time=time.time(), tripped=None, tripped_since=None, canary_weight=None,
            pins_to_canary=None, sees=None,
        )  # fmt: skip
        try:
            rel = self.release(session, self.target.release)
            phase = str(rel.get("phase"))
            off = is_canary_off(phase)
            snap.tripped = off
            snap.signal = f"phase {phase}" if off else ""
            # The contract's rule: 0 in a canary-off phase and for a quarantined canary.
            snap.canary_weight = canary_share(rel)
            snap.pins_to_canary = not off
        except ApiError as exc:
            snap.why.append(f"the broker: {exc}")
        try:
            state = self.gate_state(session).get("state")
            snap.sees = state != GateState.INCONCLUSIVE.value
            if not snap.sees:
                snap.why.append("the gate is inconclusive (too few canary samples)")
        except ApiError as exc:
            snap.why.append(f"the gate: {exc}")
        return snap


def gate_line(state: Mapping[str, object]) -> str:
    """One line on what the gate has seen: its state, its comparisons per bucket and its
    trip status (from its ``GET /v1/gate/{release}`` answer)."""
    buckets = state.get("buckets")
    held = buckets.items() if isinstance(buckets, dict) else []
    comparisons = {name: b.get("comparisons") for name, b in held if isinstance(b, dict)}
    return (
        f"the gate is {state.get('state')!r} with comparisons per bucket {comparisons}, "
        f"trip_status {state.get('trip_status')!r}"
    )
