"""The exceptions ``BrokerClient`` raises, and how an answer's status and body become one.

This module must never do I/O.
"""

from __future__ import annotations

from typing import Any

from canarystack.common.error_fields import CanaryStackError


class BrokerError(CanaryStackError):
    """Base of every error this client raises; every one carries ``method`` and ``url`` of
    the request::

        BrokerError
         ├── BrokerUnavailable    cannot connect, no answer in time, or a 5xx: retry with backoff
         │    └── BadBrokerAnswer an answer that is not what a broker answers
         ├── RevisionConflict     409: expected_revision is stale; .current_revision
         ├── IllegalTransition    409: the phase rules refuse; .current_phase, .allowed
         └── BrokerRequestError   any other 4xx; .status, .message, .param, .code
              └── BrokerNotFound  404 (no such release or version)
    """

    def __init__(self, message: str, *, method: str = "", url: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.method = method
        self.url = url


class BrokerUnavailable(BrokerError):
    """The broker could not be reached, did not answer in time, or answered 5xx."""


class RevisionConflict(BrokerError):
    """Compare-and-set failed: someone changed the release since you read it."""

    def __init__(self, message: str, current_revision: int, **kw: str) -> None:
        super().__init__(message, **kw)
        self.current_revision = current_revision


class IllegalTransition(BrokerError):
    """The phase rules refuse the change; ``allowed`` lists the phases reachable now."""

    def __init__(self, message: str, current_phase: str, allowed: list[str], **kw: str) -> None:
        super().__init__(message, **kw)
        self.current_phase = current_phase
        self.allowed = allowed


class BrokerRequestError(BrokerError):
    """The broker refused the request (4xx other than the two 409s above)."""

    def __init__(
        self,
        message: str,
        status: int,
        *,
        param: str | None = None,
        code: str | None = None,
        body: dict[str, object] | None = None,
        **kw: str,
    ) -> None:
        super().__init__(message, **kw)
        self.status = status
        self.param = param
        self.code = code
        self.body: dict[str, object] = body or {}


class BrokerNotFound(BrokerRequestError):
    """404: no such release or version."""


class BadBrokerAnswer(BrokerUnavailable):
    """The broker answered, but not with what a broker answers (e.g. a release without an
    integer ``revision``: ``--broker`` names something else)."""


def error_from(status: int, body: Any, text: str, method: str, url: str) -> BrokerError:
    err = body.get("error") if isinstance(body, dict) else None
    message = (
        str(err.get("message"))
        if isinstance(err, dict) and err.get("message")
        else (text[:300] or f"HTTP {status}")
    )
    where = {"method": method, "url": url}
    full = f"{method} {url} -> {status}: {message}"
    if status >= 500:
        return BrokerUnavailable(full, **where)
    code = err.get("code") if isinstance(err, dict) else None
    param = err.get("param") if isinstance(err, dict) else None
    if status == 409 and isinstance(body, dict):
        if "current_revision" in body:
            return RevisionConflict(full, int(body["current_revision"]), **where)
        if "current_phase" in body:
            return IllegalTransition(
                full, str(body["current_phase"]), list(body.get("allowed") or []), **where
            )
    cls = BrokerNotFound if status == 404 else BrokerRequestError
    return cls(
        full,
        status,
        param=param,
        code=code,
        body=body if isinstance(body, dict) else None,
        **where,
    )
