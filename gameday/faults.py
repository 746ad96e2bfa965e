"""Inject and clear faults on a target's components over their admin APIs.

This module never kills processes and never sends traffic anywhere but the target.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired

import requests

from canary_contract.faults import FaultAction
from gameday.api import ANNOTATION_TIMEOUT_S, STATE_TIMEOUT_S, error_text
from gameday.evidence.ledger import FaultEntry, FaultError
from gameday.sessions import given_or_own
from gameday.targets import Target, TargetError
from gameday.targets.local import StoppedPod

if TYPE_CHECKING:
    from gameday.targets.envoy_faults import EnvoyFaults


class FaultLedger:
    """What this run injected: an append-only JSON-lines file, safe across processes."""

    _lock = threading.Lock()

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, entry: FaultEntry) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(asdict(entry), default=str)
        with self._lock, self.path.open("a") as fh:
            fh.write(line + "\n")
            fh.flush()

    def entries(self) -> list[FaultEntry]:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            if line.strip():
                out.append(FaultEntry(**json.loads(line)))
        return out

    def outstanding(self) -> list[FaultEntry]:
        """Injected, not yet cleared (expiry is the component's business)."""
        cleared = {(e.url, e.fault_id) for e in self.entries() if e.action is FaultAction.CLEAR}
        return [
            e
            for e in self.entries()
            if e.action is FaultAction.INJECT and (e.url, e.fault_id) not in cleared
        ]

    def first(
        self, action: FaultAction = FaultAction.INJECT, kind: str | None = None
    ) -> FaultEntry | None:
        for e in self.entries():
            if e.action == action and (kind is None or e.kind == kind):
                return e
        return None


def annotate(
    target: Target,
    change: Mapping[str, object],
    reason: str,
    *,
    session: requests.Session | None = None,
) -> bool:
    """Best effort: add an event to the release's history on the broker (over ``session``,
    else a short-lived one of its own)."""
    try:
        url = f"{target.service_url('broker')}/v1/releases/{target.release}/events"
        with given_or_own(session) as http:
            resp = http.post(
                url,
                json={"actor": "gameday", "change": change, "reason": reason},
                headers=target.operator_headers(),
                timeout=ANNOTATION_TIMEOUT_S,
            )
        return resp.status_code == 201
    except (requests.RequestException, TargetError):
        return False


RESERVED_PARAMS = ("kind", "ttl_s")
# The ledger's url of a fault another Chaos Toolkit extension made (record_external).
EXTERNAL_PREFIX = "external:"


def _backend(target: Target, role: str) -> EnvoyFaults | None:
    """The fault backend of ``role`` when it is not an ``/admin/faults`` API (Envoy on a
    foreign stack); None: the role's replicas take faults on their admin API."""
    chooser = getattr(target, "fault_backend", None)
    return chooser(role) if callable(chooser) else None


def fault_body(
    kind: str, ttl_s: float, params: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The ``/admin/faults`` body; ValueError (FaultError) for a bad ``ttl_s`` or ``params``.

    ``params`` are the fault's own settings: they can never override the fault's ``kind``
    or its ``ttl_s`` (a params mapping that could would let an experiment file turn a
    short, named fault into a different or a permanent one).
    """
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
        raise FaultError(
            f"fault {kind!r}: ttl_s is {ttl_s!r}: give a number of seconds (e.g. ttl_s: 60)."
        )
    if not math.isfinite(ttl_s) or ttl_s <= 0:
        raise FaultError(
            f"fault {kind!r}: ttl_s is {ttl_s!r}: it must be a finite number of seconds above "
            "0, so the fault expires on its own (e.g. ttl_s: 60)."
        )
    if params is not None and not isinstance(params, dict):
        raise FaultError(
            f"fault {kind!r}: params is {type(params).__name__}: give a mapping of the "
            "fault's settings (e.g. params: {{min_prompt_tokens: 2048}})."
        )
    params = dict(params or {})
    reserved = [k for k in RESERVED_PARAMS if k in params]
    if reserved:
        raise FaultError(
            f"fault {kind!r}: params holds {', '.join(repr(k) for k in reserved)}, which params "
            "may not set: give the fault's kind and lifetime as the 'kind' and 'ttl_s' "
            "arguments of the action, not inside 'params'."
        )
    return {"kind": kind, "ttl_s": ttl_s, **params}


def inject(
    target: Target,
    component: str,
    kind: str,
    ttl_s: float,
    params: Mapping[str, object] | None = None,
    ledger: FaultLedger | None = None,
    *,
    session: requests.Session | None = None,
) -> list[FaultEntry]:
    """Inject a fault into every replica of ``component``; returns one entry per replica.

    Raises FaultError before any request for a bad ``ttl_s`` or ``params`` (see
    ``fault_body``), BlastRadiusError before any request if the component is not allowed,
    and FaultError if a replica refused (the ones that accepted are in the ledger, so they
    are cleared by ``clear_injected``).

    Every injection is checked against the target's blast radius, sent to every replica of
    the component (``/admin/faults`` on each replica's own URL), written to a fault ledger
    (JSON lines, append-only, in the run folder) and announced to the broker as a
    ``fault_injected`` annotation (best effort: the release's timeline). Clearing deletes
    exactly the faults the ledger holds by id; a 404 means the component already dropped it
    (expired, or the pod restarted clean). The TTL is enforced by each component itself, so
    a fault outlives neither its TTL nor a dead harness.

    Every request goes over ``session`` when given, else over a short-lived one of its own.
    """
    body = fault_body(kind, ttl_s, params)
    params = {k: v for k, v in body.items() if k not in RESERVED_PARAMS}
    roles = target.check_allowed(component)
    done: list[FaultEntry] = []
    failures: list[str] = []
    role = ""

    def injected(replica: str, url: str, fault_id: str) -> None:
        """One replica took the fault: into the ledger, and into what is returned."""
        entry = FaultEntry(
            action=FaultAction.INJECT,
            time=time.time(),
            component=role,
            replica=replica,
            url=url,
            kind=kind,
            fault_id=fault_id,
            ttl_s=ttl_s,
            params=params,
        )
        if ledger is not None:
            ledger.append(entry)
        done.append(entry)

    with given_or_own(session) as http:
        for role in roles:
            backend = _backend(target, role)
            if backend is not None:  # Envoy's fault filter (a foreign stack's router)
                try:
                    fault_id = backend.inject(kind, ttl_s, params, http)
                except TargetError as exc:
                    failures.append(f"{role} (Envoy {backend.admin_url}): {exc}")
                    continue
                injected(f"{role}-envoy", backend.admin_url, fault_id)
                continue
            replicas = target.replicas(role)
            if not replicas:
                failures.append(f"{role}: no replicas found")
            for rep in replicas:
                try:
                    resp = http.post(
                        f"{rep.url}/admin/faults",
                        json=body,
                        headers=target.fault_headers(role),
                        timeout=STATE_TIMEOUT_S,
                    )
                except requests.RequestException as exc:
                    failures.append(f"{rep.name} ({rep.url}): {exc.__class__.__name__}: {exc}")
                    continue
                if resp.status_code != 201:
                    failures.append(f"{rep.name}: HTTP {resp.status_code}: {error_text(resp)}")
                    continue
                injected(rep.name, rep.url, str(resp.json()["id"]))
        if done:
            annotate(
                target,
                {
                    "annotation": "fault_injected",
                    "component": component,
                    "kind": kind,
                    "fault_ids": [e.fault_id for e in done],
                    "replicas": [e.replica for e in done],
                    "params": params,
                    "ttl_s": ttl_s,
                },
                reason=f"gameday injected {kind} into {component}",
                session=http,
            )
    if failures:
        raise FaultError(
            f"injecting {kind!r} into {component}: {len(failures)} replica(s) failed: "
            + "; ".join(failures)
        )
    return done


def clear_injected(
    target: Target,
    ledger: FaultLedger,
    component: str | None = None,
    *,
    session: requests.Session | None = None,
) -> list[FaultEntry]:
    """Clear every outstanding fault in the ledger (optionally of one component), over
    ``session`` when given, else over a short-lived one of its own."""
    cleared: list[FaultEntry] = []
    errors: list[str] = []
    with given_or_own(session) as http:
        for e in ledger.outstanding():
            if component is not None and component not in (e.component, "model"):
                continue
            if component == "model" and not e.component.startswith("model-"):
                continue
            if not e.url or e.url.startswith(EXTERNAL_PREFIX):
                # another extension's fault, or a foreign engine's bad build: no admin API
                # holds it; its own rollback (the extension's, the rollout's undo) clears it
                entry = e.cleared({"external": True, "note": "no fault API holds it"})
                ledger.append(entry)
                cleared.append(entry)
                continue
            try:
                backend = _backend(target, e.component)
            except TargetError as exc:
                errors.append(f"{e.replica}: {exc}")
                continue
            if backend is not None:
                try:
                    present = backend.clear(str(e.fault_id), http)
                except TargetError as exc:
                    errors.append(f"{e.replica}: {exc}")
                    continue
                entry = e.cleared({"already_gone": not present})
                ledger.append(entry)
                cleared.append(entry)
                continue
            try:
                resp = http.delete(
                    f"{e.url}/admin/faults/{e.fault_id}",
                    headers=target.fault_headers(e.component),
                    timeout=STATE_TIMEOUT_S,
                )
            except requests.RequestException as exc:
                errors.append(f"{e.replica}: {exc.__class__.__name__}")
                continue
            except TargetError as exc:  # its fault credential cannot be read
                errors.append(f"{e.replica}: {exc}")
                continue
            if resp.status_code not in (200, 404):
                errors.append(f"{e.replica}: HTTP {resp.status_code}: {error_text(resp)}")
                continue
            entry = e.cleared({"already_gone": resp.status_code == 404})
            ledger.append(entry)
            cleared.append(entry)
        if cleared:
            annotate(
                target,
                {
                    "annotation": "fault_cleared",
                    "fault_ids": [e.fault_id for e in cleared],
                    "replicas": [e.replica for e in cleared],
                },
                reason="gameday cleared its faults",
                session=http,
            )
    if errors:
        # Unreachable replicas: their faults still expire by TTL; say so, do not hide it.
        raise FaultError(
            "could not clear some faults (they expire by their TTL): " + "; ".join(errors)
        )
    return cleared


def kill_pod(
    target: Target,
    component: str,
    replica: str | None = None,
    ledger: FaultLedger | None = None,
    *,
    session: requests.Session | None = None,
) -> FaultEntry:
    """Kill one pod of ``component`` (after the blast-radius check) and record it (the
    annotation over ``session`` when given)."""
    roles = target.check_allowed(component)
    if len(roles) != 1:
        raise TargetError(
            f"kill which pod? {component!r} stands for {', '.join(roles)}: name one role."
        )
    killed = target.kill_pod(roles[0], replica)
    entry = FaultEntry(
        action=FaultAction.KILL,
        time=time.time(),
        component=roles[0],
        replica=killed.name,
        url="",
        kind="pod-kill",
        detail=killed.detail,
    )
    if ledger is not None:
        ledger.append(entry)
    annotate(
        target,
        {
            "annotation": "pod_killed",
            "component": roles[0],
            "replica": killed.name,
            **killed.detail,
        },
        reason=f"gameday killed {killed.name}",
        session=session,
    )
    return entry


class PausedPod(StoppedPod):
    """A pod ``pause_pod`` stopped; ``resumed`` (whether SIGCONT reached the same process)
    and ``resumed_at`` once it was resumed."""

    resumed: NotRequired[bool]
    resumed_at: NotRequired[float]


def pause_pod(
    target: Target,
    component: str,
    seconds: float,
    replica: str | None = None,
    on_stopped: Callable[[PausedPod], None] | None = None,
) -> PausedPod:
    """SIGSTOP one pod of ``component`` for ``seconds``, then SIGCONT it (always, also when
    interrupted), by PID; annotated on the release's history both times. ``on_stopped``
    gets the record as soon as the pod is stopped (so a rollback can resume it if this
    process dies meanwhile). A hung process, not a dead one: its port still accepts
    connections and nothing answers; supervisord does not restart it."""
    roles = target.check_allowed(component)
    if len(roles) != 1:
        raise TargetError(
            f"pause which pod? {component!r} stands for {', '.join(roles)}: name one role."
        )
    stop, resume = getattr(target, "stop_pod", None), getattr(target, "resume_pod", None)
    if not callable(stop) or not callable(resume):
        raise TargetError(
            f"{target.kind} target: pausing a pod (SIGSTOP by PID) needs the local target; "
            "run this experiment against the embedded stack (targets/local.yaml)."
        )
    stopped: PausedPod = stop(roles[0], replica)
    if on_stopped is not None:
        on_stopped(stopped)
    what = {"component": roles[0], "replica": stopped["name"], "pid": stopped["pid"]}
    annotate(target, {"annotation": "pod_paused", **what, "seconds": seconds}, "gameday paused it")
    try:
        time.sleep(seconds)
    finally:
        stopped["resumed"] = resume(stopped)
        stopped["resumed_at"] = time.time()
    annotate(target, {"annotation": "pod_resumed", **what}, "gameday resumed it")
    return stopped


def record_external(
    target: Target,
    component: str,
    kind: str,
    ledger: FaultLedger,
    source: str,
    at: float | None = None,
    params: Mapping[str, object] | None = None,
) -> FaultEntry:
    """A fault made by another Chaos Toolkit extension (chaostoolkit-kubernetes, -istio,
    plain ``http``) into the run's ledger, so the fault-relative checks measure from it.
    ``component`` is checked against the blast radius like any fault of ours; ``kind``
    ``pod-kill`` is recorded as a kill. Clearing it is the extension's own rollback."""
    roles = target.check_allowed(component)
    if not kind or not isinstance(kind, str):
        raise FaultError(f"external fault: kind is {kind!r}: name it (e.g. kernel, pod-kill)")
    when = time.time() if at is None else float(at)
    if not math.isfinite(when) or abs(when - time.time()) > 3600:
        raise FaultError(
            f"external fault: at is {at!r}: give the epoch seconds it happened (within the "
            "last hour), or leave it out for now"
        )
    entry = FaultEntry(
        action=FaultAction.KILL if kind == "pod-kill" else FaultAction.INJECT,
        time=when,
        component=roles[0] if len(roles) == 1 else component,
        replica=source,
        url=f"{EXTERNAL_PREFIX}{source}",
        kind=kind,
        fault_id=f"{EXTERNAL_PREFIX}{source}:{when:.3f}",
        params=dict(params or {}),
        detail={"external": True, "source": source},
    )
    ledger.append(entry)
    return entry
