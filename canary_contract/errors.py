"""The error vocabulary of the wire: what a refused record raises, and the error kinds and
codes a component's JSON error answer (``{"error": {...}}``) carries."""

from __future__ import annotations

import enum


class ContractError(ValueError):
    """A value off the wire that does not have the contract's shape.

    ``record`` is the record that refused it, ``field`` the dotted path of the first bad
    field (``""`` for the whole value); the message names both and says what was wrong.
    """

    def __init__(self, record: str, field: str, problem: str) -> None:
        where = f"field '{field}'" if field else "the value"
        super().__init__(f"Not a valid {record}: {where}: {problem}")
        self.record = record
        self.field = field
        self.problem = problem


class ErrorKind(enum.StrEnum):
    """The ``error.type`` of a JSON error answer (the OpenAI spelling)."""

    INVALID_REQUEST = "invalid_request_error"  # 400, 413, 422
    AUTHENTICATION = "authentication_error"  # 401
    PERMISSION = "permission_error"  # 403
    NOT_FOUND = "not_found_error"  # 404
    CONFLICT = "conflict_error"  # 409
    UNAVAILABLE = "service_unavailable"  # 503
    SERVER = "server_error"  # 500: a bug, logged


class ErrorCode(enum.StrEnum):
    """The ``error.code`` values the stack sends today (``null`` when none applies).

    Readers take ``code`` as text (``ErrorBody.code``): a component may add a code before
    this list names it; tests check that every code the stack raises is listed here.
    """

    BODY_TOO_LARGE = "body_too_large"
    INVALID_JSON = "invalid_json"
    NON_FINITE = "non_finite"
    FORBIDDEN = "forbidden"
    SIMULATED_FAULT = "simulated_fault"
    FAULT_ABORT = "fault_abort"
    # broker
    VERSION_CONFLICT = "version_conflict"
    VERSION_QUARANTINED = "version_quarantined"
    UNKNOWN_VERSION = "unknown_version"
    DIGEST_MISMATCH = "digest_mismatch"
    RELEASE_EXISTS = "release_exists"
    REVISION_CONFLICT = "revision_conflict"
    ILLEGAL_TRANSITION = "illegal_transition"
    NO_CANARY = "no_canary"
    STORE_LOST = "store_lost"  # 503: the store is older than what the broker acknowledged
    NO_STORE_LOSS = "no_store_loss"
    REVISION_AHEAD = "revision_ahead"  # a heartbeat claims a revision never issued
    ROUTER_IDENTITY = "router_identity"  # a heartbeat credential speaks for another router
    TOO_MANY_ROUTERS = "too_many_routers"
    IDENTITY_UNAVAILABLE = (
        "identity_unavailable"  # 503: the API server's TokenReview did not answer
    )
    # rollback executor
    STEP_REFUSED = "step_refused"
    # router
    CANARY_OFF = "canary_off"
    NO_POOL = "no_pool"
    POOL_DOWN = "pool_down"
    UPSTREAM_FAILED = "upstream_failed"
    BROKEN_STREAM = "broken_stream"
    REQUEST_DEADLINE = "request_deadline"  # 504: the whole request outlived its deadline
    TOO_MANY_CLIENT_STREAMS = "too_many_client_streams"  # 429: one client's cap
    TOO_MANY_POOL_STREAMS = "too_many_pool_streams"  # 429: a model pool's cap
    # model server / engine pod
    MODEL_NOT_FOUND = "model_not_found"
    PROMPT_TOO_LARGE = "prompt_too_large"
    ENGINE_UNAVAILABLE = "engine_unavailable"
