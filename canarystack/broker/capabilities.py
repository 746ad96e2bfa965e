"""Who may write what: THE capability table of the broker (``WRITES``, ``PATCH_EDGES``,
``PATCH_FIELDS``), written down once; reads stay open.

This module must never do I/O or know about SQLite: it is the pure rule book.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from canarystack.broker.phases import Phase
from canarystack.common.auth import (
    Forbidden,
    TokenFileError,
    load_token_file,
    presented_token,
)
from canarystack.common.errors import Unauthorized

OPERATOR = "operator"
TRIP = "trip"
ROLLBACK = "rollback"
HEARTBEAT = "heartbeat"
# The broker's own fault credential (--admin-token-file): /admin/faults only.
FAULTS = "faults"

# Each credential (docs/ARCHITECTURE.md §8) grants a set of broker writes. ``operator``
# (people, the harness): every write. ``trip`` (the gate): ``progressing -> tripped`` with
# the trip evidence, nothing else. ``rollback`` (the rollback executor): canary weight ->
# 0, ``progressing | tripped -> rolling_back -> rolled_back``, quarantine of a version
# that is a release's canary, and step annotations (``progressing -> rolling_back`` is the
# manual rollback an operator asks the executor for). ``heartbeat`` (routers):
# ``POST /v1/routers/heartbeat`` only. Single-credential mode (no ``--credentials-dir``):
# the one admin token holds every credential; the broker logs that least privilege is off.
BROKER_CREDENTIALS: tuple[str, ...] = (OPERATOR, TRIP, ROLLBACK, HEARTBEAT)

# What each credential may do, in words (for 403 messages and /v1/whoami).
GRANTS: Mapping[str, str] = {
    OPERATOR: "make every broker write",
    TRIP: "move progressing -> tripped with trip evidence",
    ROLLBACK: (
        "set the canary weight to 0, move progressing|tripped -> rolling_back -> "
        "rolled_back, quarantine a release's canary version and annotate rollback steps"
    ),
    HEARTBEAT: "send router heartbeats (POST /v1/routers/heartbeat)",
    FAULTS: "use this broker's /admin/faults",
}

# THE table: each write and the credentials that may make it.
WRITES: Mapping[str, frozenset[str]] = {
    "register_version": frozenset({OPERATOR}),
    "quarantine_version": frozenset({OPERATOR, ROLLBACK}),
    "create_release": frozenset({OPERATOR}),
    "patch_release": frozenset({OPERATOR, TRIP, ROLLBACK}),
    "annotate": frozenset({OPERATOR, ROLLBACK}),
    "heartbeat": frozenset({OPERATOR, HEARTBEAT}),
    "accept_store_loss": frozenset({OPERATOR}),
}

# What a write is, in words ("it cannot <this>").
WRITE_WORDS: Mapping[str, str] = {
    "register_version": "register versions",
    "quarantine_version": "quarantine versions",
    "create_release": "create releases",
    "patch_release": "change releases",
    "annotate": "annotate releases",
    "heartbeat": "send router heartbeats",
    "accept_store_loss": "accept a loss of the broker's store",
}

# For the credentials that may PATCH but not freely: the phase edges and fields allowed.
PATCH_EDGES: Mapping[str, frozenset[tuple[Phase, Phase]]] = {
    TRIP: frozenset({(Phase.PROGRESSING, Phase.TRIPPED)}),
    ROLLBACK: frozenset(
        {
            (Phase.PROGRESSING, Phase.ROLLING_BACK),
            (Phase.TRIPPED, Phase.ROLLING_BACK),
            (Phase.ROLLING_BACK, Phase.ROLLED_BACK),
        }
    ),
}
PATCH_FIELDS: Mapping[str, frozenset[str]] = {
    TRIP: frozenset({"phase", "trip"}),
    ROLLBACK: frozenset({"phase", "weights"}),
}
# The only canary weight a credential may set (absent: any).
WEIGHT_ONLY: Mapping[str, float] = {ROLLBACK: 0.0}


# A router-bound heartbeat credential: ``rt1.<base64url router id>.<hex HMAC-SHA256 of the
# id under the heartbeat token>``. Whoever holds it may heartbeat as that router only;
# only a holder of the heartbeat token (the operator) can mint one (``router_token``).
ROUTER_TOKEN_PREFIX = "rt1."


def router_token(heartbeat_token: str, router_id: str) -> str:
    """The heartbeat credential bound to ``router_id`` (minted from the heartbeat token)."""
    encoded = base64.urlsafe_b64encode(router_id.encode()).decode().rstrip("=")
    return f"{ROUTER_TOKEN_PREFIX}{encoded}.{_router_mac(heartbeat_token, router_id)}"


def _router_mac(heartbeat_token: str, router_id: str) -> str:
    key = heartbeat_token.encode()
    return hmac.new(key, b"router:" + router_id.encode(), hashlib.sha256).hexdigest()


def _bound_router(heartbeat_token: str, given: str) -> str | None:
    """The router id ``given`` is bound to, when it is a router credential minted from
    ``heartbeat_token``; else None."""
    if not given.startswith(ROUTER_TOKEN_PREFIX):
        return None
    encoded, _, mac = given[len(ROUTER_TOKEN_PREFIX) :].rpartition(".")
    try:
        router_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not router_id or not hmac.compare_digest(
        mac.encode(), _router_mac(heartbeat_token, router_id).encode()
    ):
        return None
    return router_id


@dataclass(frozen=True)
class Credentials:
    """Token -> credential name. ``single`` is the single-credential mode."""

    tokens: Mapping[str, str] = field(default_factory=dict)  # name -> token
    fault_token: str | None = None
    single: bool = False

    def identify(self, request: web.Request) -> str:
        """The name of the credential the request carries, or 401."""
        given = presented_token(request, "credential")
        if self.fault_token is not None and hmac.compare_digest(
            given.encode(), self.fault_token.encode()
        ):
            return FAULTS
        for name, token in self.tokens.items():
            if hmac.compare_digest(given.encode(), token.encode()):
                return name
        if self.bound_router(request) is not None:
            return HEARTBEAT
        if not self.tokens and self.fault_token is None:
            raise Unauthorized(
                "The broker's write API is disabled: it was started without credentials. "
                "Restart it with --credentials-dir DIR (or an admin token in "
                "single-credential mode)."
            )
        raise Unauthorized(
            "Unknown credential in the Authorization header: this broker knows "
            f"{', '.join(self.names())}; send one of those tokens."
        )

    def bound_router(self, request: web.Request) -> str | None:
        """The router id the request's credential is bound to (``router_token``), or None
        for every other credential."""
        secret = self.tokens.get(HEARTBEAT) or (self.tokens.get(OPERATOR) if self.single else None)
        if secret is None:
            return None
        return _bound_router(secret, presented_token(request, "credential"))

    def names(self) -> list[str]:
        return list(self.tokens) + ([FAULTS] if self.fault_token is not None else [])

    def capabilities(self, credential: str) -> list[str]:
        if self.single:
            return [*BROKER_CREDENTIALS, FAULTS]
        return [credential]


def single_credential(admin_token: str | None) -> Credentials:
    """Single-credential mode: the admin token holds every credential."""
    if admin_token is None:
        return Credentials(single=True)
    return Credentials(tokens={OPERATOR: admin_token}, fault_token=None, single=True)


def load_credentials_dir(directory: str, fault_token: str | None) -> Credentials:
    """Read ``operator``, ``trip``, ``rollback``, ``heartbeat`` from ``directory``."""
    path = Path(directory)
    if not path.is_dir():
        raise TokenFileError(
            f"--credentials-dir {directory}: not a folder. Give a folder holding the files "
            f"{', '.join(BROKER_CREDENTIALS)} (one token each)."
        )
    tokens: dict[str, str] = {}
    for name in BROKER_CREDENTIALS:
        file = path / name
        if not file.exists():
            raise TokenFileError(
                f"--credentials-dir {directory}: no file {name!r}. The folder must hold "
                f"{', '.join(BROKER_CREDENTIALS)}, one token each."
            )
        tokens[name] = load_token_file("--credentials-dir", os.fspath(file))
    seen: dict[str, str] = {}
    for name, token in [*tokens.items(), *([(FAULTS, fault_token)] if fault_token else [])]:
        if token in seen:
            raise TokenFileError(
                f"--credentials-dir {directory}: credentials {seen[token]!r} and {name!r} "
                "hold the same token, so neither proves which one the caller has; give "
                "each its own (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')."
            )
        seen[token] = name
    return Credentials(tokens=tokens, fault_token=fault_token)


def _refuse(credential: str, tried: str) -> Forbidden:
    return Forbidden(
        f"The {credential} credential may only {GRANTS[credential]}; it cannot {tried}.",
        code="forbidden",
        extra={"credential": credential, "may": GRANTS[credential]},
    )


def check_write(credentials: Credentials, credential: str, write: str) -> None:
    """403 unless ``credential`` may make ``write`` at all."""
    if credentials.single and credential == OPERATOR:
        return
    if credential not in WRITES[write]:
        raise _refuse(credential, WRITE_WORDS[write])


def check_patch(
    credential: str,
    current: Phase,
    target: Phase,
    *,
    fields: frozenset[str],
    canary_weight: float | None,
) -> None:
    """403 unless ``credential`` may make this release change (checked in the transaction).

    ``fields``: the body fields the PATCH sets (``phase``, ``weights``, ``canary``, ``trip``).
    A PATCH is checked as a *transition*: the phase it moves from and to, and which fields
    it sets, against ``PATCH_EDGES`` / ``PATCH_FIELDS``, inside the store's transaction (so
    the phase it is checked against is the one it changes). Refusals are 403 with a message
    naming the credential, what it tried and what it may do.
    """
    if credential == OPERATOR:
        return
    allowed_fields = PATCH_FIELDS.get(credential, frozenset())
    extra = sorted(fields - allowed_fields)
    if extra:
        words = {"weights": "set weights", "canary": "change the canary version"}
        raise _refuse(credential, " or ".join(words.get(f, f"set {f}") for f in extra))
    only = WEIGHT_ONLY.get(credential)
    if canary_weight is not None and only is not None and canary_weight != only:
        raise _refuse(credential, f"set the canary weight to {canary_weight:g}")
    if target == current:
        return
    if (current, target) not in PATCH_EDGES.get(credential, frozenset()):
        tried = "promote" if target == Phase.PROMOTED else f"move {current} -> {target}"
        raise _refuse(credential, tried)
